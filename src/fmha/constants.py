"""Numbers the math uses everywhere, written once: the kernels work in base 2 (``exp2``, ``log2``,
the scale folded with ``log2(e)`` on the host) and report natural logs (times ``ln 2``)."""
import math

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
