"""Kernel configurations: data, one table per variant, the measurement beside each entry.

A :class:`KernelConfig` fixes the tile shape and the launch parameters.  The
``singlewave`` and ``pipelined`` entries are the seed's identity (16x16 tiles,
one warp) on every target.  The ``tiled`` table is keyed by architecture and
head dimension; the interpreter entry is small so CPU tests stay quick.  There
is no autotuning on the default path: ``fmha sweep`` explores, this table decides.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1
    maxnreg: int = 0  # registers per consumer thread (hopper's setmaxnreg); 0: the variant's default
    persistent: int = -1  # hopper: 1 one program per SM, 0 one per work item, -1 the variant's default (1)
    split_per_sm: int = 0  # key-split launches: programs per SM the split aims for; 0: the default (4)
    pingpong: int = 0  # hopper: 1 the consumer warpgroups take turns issuing their matrix products
    head_group: int = 0  # hopper: work items numbered across this many heads at once; 0: head-major (1)
    tma: int = 0  # tiled: 1 K/V read by TMA (3-D descriptors; sm_90, contiguous K/V, not varlen or paged)
    q_regs: int = 0  # hopper: 1 each consumer warpgroup holds its Q in registers (Q K^T reads only K from smem)
    fence: int = 0  # hopper: 1 the softmax is fenced above the wait for P V (ptxas moves that wait up otherwise)
    split_tail: int = 0  # hopper, non-causal: 1 a partly filled last round's items run in pieces, merged by LSE
    balance: int = 0  # hopper, causal persistent: 1 the last round or two of pairs dealt longest item first
    occupancy: int = 0  # hopper: programs resident on each SM (the persistent grid, the registers split for it); 0: 1
    lazy: int = 0  # hopper: 1 a row's pivot moves only when its max grows by more than 2**8; O rescaled only then
    cluster: int = 0  # hopper, dense non-causal: 1 programs are 2-CTA clusters reading each K/V tile once (multicast)
    stale: int = 0  # hopper: 1 no row max past the first tile (the pivot stands until a tile's row sum passes 2**15)

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        regs = f"r{self.maxnreg}" if self.maxnreg else ""
        sched = f"p{self.persistent}" if self.persistent >= 0 else ""
        fill = f"f{self.split_per_sm}" if self.split_per_sm else ""
        turns = "pp" if self.pingpong else ""
        heads = f"h{self.head_group}" if self.head_group else ""
        tma = "t" if self.tma else ""
        q_regs = "q" if self.q_regs else ""
        fence = "z" if self.fence else ""
        tail = "k" if self.split_tail else ""
        balance = "b" if self.balance else ""
        occupancy = f"o{self.occupancy}" if self.occupancy else ""
        lazy = "l" if self.lazy else ""
        cluster = "c" if self.cluster else ""
        stale = "x" if self.stale else ""
        return (f"m{self.block_m}n{self.block_n}w{self.num_warps}s{self.num_stages}{regs}{sched}{fill}{turns}{heads}"
                f"{tma}{q_regs}{fence}{tail}{balance}{occupancy}{lazy}{cluster}{stale}")


SEED = KernelConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)

# (arch, max head_dim) -> config, first match wins.  arch: "interpreter", "sm90",
# "sm80" (any other CUDA), "hip".
TILED = [
    ("interpreter", 256, KernelConfig(32, 32, 4, 1)),      # small tiles: fewer masked lanes on tiny tests
    # H200, bf16, B=4 S=4096 (bench/logs/2026-11-29-probe1-probe_tiled.txt), TFLOP/s non-causal/causal:
    ("sm90", 64, KernelConfig(128, 64, 4, 3)),     # 404/339; m64n64w4s3 370/353, m128n128w8s3 346/303
    ("sm90", 128, KernelConfig(128, 128, 8, 3)),   # 489/435; m64n64w4s3 506/423, m128n64w8s3 448/409
    ("sm90", 256, KernelConfig(64, 32, 4, 2)),             # D=256: the accumulator alone is 64 KB of registers
    ("sm80", 64, KernelConfig(128, 64, 4, 3)),
    ("sm80", 128, KernelConfig(128, 64, 8, 2)),
    ("sm80", 256, KernelConfig(64, 32, 4, 2)),
    # no AMD chip to time: chosen by `fmha compile --target gfx1151` (fewest VGPR spills of 6 shapes)
    ("hip", 64, KernelConfig(64, 32, 4, 1)),       # 189 VGPRs, 0 spills; m64n64w4 spills 30
    ("hip", 128, KernelConfig(32, 16, 2, 1)),      # 8 spilled VGPRs; m64n64w4 spills 444
    ("hip", 256, KernelConfig(32, 16, 2, 1)),      # 288 spilled; every shape tried spills at D=256
]


# the Gluon sm_90 kernel: block_m = 64 x consumer warpgroups (64, 128 or 192), num_stages = ring depth.
# (head_dim, causal, longest seqlen_k) -> config, first match wins.  `fmha sweep --variant hopper`,
# H200 bf16, TFLOP/s at S=1024 / S=16384, runs 20261129T131415 and 20261129T133824 (session 1: one
# program a block, O staged in the Q slot).  Since session 2 O has its own buffer (Q is released
# early for the next work item), so 3 stages no longer fit at D=128.  Causal, one program per item
# (p0) against persistent (p1), `--grid default --where causal=1`, run 20261129T161833 (p1 then
# walked a snake; the pairs of equal cost replaced it), TFLOP/s at S=512/1k/2k/4k/8k/16k:
#   D=64   p0 176/259/339/394/427/454   p1 234/317/377/420/440/447
#   D=128  p0 266/369/457/523/568/618   p1 330/403/504/522/551/471
# and with the pairs, run 20261129T163549:
#   D=64   p0 175/257/338/394/431/461   p1 235/315/381/421/451/455
#   D=128  p0 265/370/504/526/576/620   p1 324/428/514/619/605/621
HOPPER = [
    # Session 8 (bf16 and fp16, cuDNN in each run): Q held in registers (q_regs, "q") and the softmax
    # fenced above the wait for P V ("z"; ptxas had moved that wait above the exponentials, so the
    # softmax never overlapped P V).  Q in registers, runs 20261129T234921 (no fence) and 20261130T000615 (fence),
    # TFLOP/s bf16 q against the table at S=512..16k: D=64 causal 243/322/377/412/431/456 vs
    # 231/308/367/405/429/444; D=64 non-causal (128 rows) 379/417 vs 355/397; D=128 causal 306/418/512/
    # 563/593/601 vs 298/397/480/539/575/593; D=128 non-causal without the fence 484/496/514/537/560/569 vs
    # 464/510/563/597/616/629 (lost from 1k), with it 484/553/592/613/627/632 vs the unfenced table
    # 478/521/573/607/630/637 (T000948-old, same GPU just after).  The fence alone: D=64 causal 2k-16k 4-6%
    # slower, D=64 non-causal and D=128 +-1%; with Q in registers it lost at D=128 causal (488 vs 512 at
    # 2k).  At D=64 past 1k keys (192 rows, 160 registers) Q in registers spills 56.  128k keys
    # (extra grid): q 616/624 vs 576/595 (non-causal/causal, 20261129T235051-gpu1), fenced 619 (T000852-gpu1).
    # D=64 non-causal, persistent, run 20261129T165522 (bf16, S=512/1k/2k): m128 357/405/433, m192 339/376/434
    # (192 rows pad a 512- or 1024-row sequence by 11%)
    # Tried and not taken (run 20261129T193402, bf16, S=512..16k, non-causal): the next item's first
    # Q K^T issued behind this item's last P V, under its epilogue (commit 051427c, reverted): 342/391/
    # 421/441/444/445 against 379/412/440/452/460/459 (2-10% slower); the early product holds 64 more fp32
    # registers per thread through the epilogue.
    # Session 20, the standing pivot ("x", stale=1: no row max past an item's first key tile, 353 instructions a
    # thread a key tile against 422; a warpgroup vote a tile, bar.red, on whether a row's sum passed 2**15, that
    # rare tile multiplied again with its max) beside the table, run 20261130T142054 (bf16, bench/gpu_s20a.sh),
    # TFLOP/s at S=512..16k non-causal: 373/424/492/509/539/541 against 379/418/467/483/515/517 (the 192-row row
    # spills 26 registers with it and still gains); causal 274/320/369/406/370/389 against 281/343/395/415/456/486
    # (the vote's branch is a block edge, a fence, which lost on the causal rows in session 8 too)
    (64, False, 512, KernelConfig(128, 128, 4, 2, q_regs=1)),
    (64, False, 1024, KernelConfig(128, 128, 4, 2, q_regs=1, stale=1)),
    # 192 rows with ping-pong (the three consumer warpgroups take turns issuing their products) beside the
    # table, run 20261130T022815 (bf16) and T022815-gpu1 (fp16), TFLOP/s at S=2k/4k/8k/16k: bf16 472/491/516/521
    # against 452/477/506/511, fp16 455/473/502/504 against 442/459/490/497; at 512 and 1k (128 rows) 2% slower,
    # and causal, 0.95-1.00x.  128 x 256 tiles (one m64n256k16 wgmma a k-step of Q K^T, half of Q's operand bytes
    # per FLOP; 12 spill instructions in the 829 of the loop), run 20261130T083213 (bf16), S=512..16k: 344/366/379/
    # 384/386/383 against 384/427/471/491/524/528; causal (T083214-gpu1) and fp16 (T083315-gpu1) alike
    (64, False, None, KernelConfig(192, 128, 4, 2, pingpong=1, stale=1)),  # plain 376/510; m128n128s3 365/446 (p0)
    # causal, tried and not taken (run 20261129T181530, bf16, S=512..16k): a warpgroup whose rows end in
    # the first half of the diagonal tile multiplying that half only (commit 140967c, reverted): D=64
    # 228/318/387/411/431/440 against 231/315/390/416/436/445; its partner warpgroup still runs the
    # whole tile and both wait on the same K/V ring, so the saving became idle time.  Ping-pong at D=64
    # S=512..2k: 226/320/- against 231/316/376 (T175746).
    # balance ("b": the pairs' last round or two dealt by LPT from a host-built list; 2048 pairs on 132
    # programs end 15.5 rounds in) beside the table, runs 20261130T021445 (bf16) and T021411-gpu1 (fp16),
    # TFLOP/s at S=512..16k: bf16 247/328/387/423/462/496 against 250/325/378/413/446/480, fp16
    # 246/343/375/407/450/477 against 240/341/371/403/440/468.  At D=128 no gain (317/436/521/579/603/619
    # against 317/433/524/575/604/619 bf16), and a loss on the extra grid's causal cells: 2048 rows on 8192
    # keys 489 against 502, 128k keys 588 against 630 (extra grid T021630): not taken there, nor past 16k keys here.
    # up to 512 keys: 64-row programs (one consumer warpgroup each), three on an SM (occupancy, "o3"; 80
    # registers at launch, 136 for the consumer), 64-key tiles.  A 128-row item has 1-4 key tiles and both its
    # warpgroups wait on one K/V ring; three independent programs overlap each other's softmax and loads, and
    # 64x64 tiles waste a tenth less of the diagonal.  Beside the table, runs 20261130T031647 (bf16) and
    # T031647-gpu1 (fp16), TFLOP/s at S=512/1k/2k/4k/8k/16k: bf16 275/328/369/388/404/408 against
    # 245/328/388/423/465/499 (cuDNN 252 at 512), fp16 275/337/372/382/393/400 against 246/342/388/414/454/486
    # (cuDNN 253); again T031922 and T031923-gpu1: 267 against 240 bf16 (cuDNN 247), 253 against 230 fp16
    # (cuDNN 237).  Two on an SM with 128-key tiles ("o2", 232 registers) 243/309/364/402/420/430, four (104
    # registers, 16 bytes spilled) 253/303/338/360/369/374 (bf16, T031922); non-causal every 64-row choice lost
    # (356 against 382 at 512)
    (64, True, 512, KernelConfig(64, 64, 4, 2, q_regs=1, balance=1, occupancy=3)),
    (64, True, 4096, KernelConfig(128, 128, 4, 2, q_regs=1, balance=1)),
    # m192n128s2 232/477 (192 rows waste the diagonal).  Past 4k keys 192 rows (persistent pairs, Q in
    # shared memory) against the table's 128 rows with Q in registers, run 20261130T012401 (bf16, S=512..16k):
    # 134/213/278/401/447/474 against 244/321/375/412/432/455 (one program an item: 141/211/322/385/442/472)
    (64, True, 16384, KernelConfig(192, 128, 4, 2, balance=1)),
    (64, True, None, KernelConfig(192, 128, 4, 2)),
    # D=128 non-causal up to 512 keys: FA3's ping-pong, items across heads (4, since session 19 2).  bf16 S=512:
    # pp 544 vs 482 (run 20261129T174216); pph4 530, pp 486, h4 465, plain 455 (T175528).  At S=1k pp
    # lost once (565 vs 617, T174216), pph4 won once (613 vs 527, T175528): not taken there yet.
    # Session 19: items across 2 heads instead of 4, +0.85% bf16 and +0.54% fp16 over six rounds on two GPUs, the
    # provider order turned each round (runs 20261130T134845 to T135102-gpu1, bench/gpu_s19f.sh; each round +0.1% or
    # more); at D=64 (head-major) head groups of 2 or 4 lost 3%, at D=128 1k even
    # Session 20, the standing pivot (see D=64), runs 20261130T142054 (bf16) and T142312-gpu1 (fp16), TFLOP/s at
    # S=512..16k: bf16 489/576/622/654/666/678 against 474/559/606/634/650/655, fp16 478/559/607/636/648/659
    # against 459/543/592/615/629/628; sustained at 16k (bench/power_probe.py, both GPUs) 664/671 against 640/642
    # at 1635 against 1650-1665 MHz under the same 690 W, one call from idle 771/765 against 729/735
    (128, False, 512, KernelConfig(128, 128, 4, 2, pingpong=1, head_group=2, q_regs=1, fence=1, stale=1)),
    # D=128 non-causal 1k-4k keys: items across 4 heads at a time, TFLOP/s at S=1k/2k/4k bf16, h4 against
    # head-major: 545/662/634 vs 527/651/609 (run 20261129T175528), 536/583/614 vs 530/578/608 (T180941);
    # at 8k 635 vs 634, at 16k 622 vs 637 (T175528): head-major stays there
    # lazy ("l", FlashAttention-4's conditional rescale: a row's pivot moves only when its max grows by more
    # than 2**8, and a thread skips O's 64 multiplications when both its rows kept theirs) beside the table,
    # runs 20261130T050446 (bf16) and T050446-gpu1 (fp16), TFLOP/s at S=1k/2k/4k/8k/16k: bf16 542/582/604/605/611
    # against 538/575/600/616/627, with the fence 540/583/609/625/628; fp16 536/573/599/603/603 against
    # 532/566/591/608/620, with the fence 532/574/599/618/619.  At 512 keys even (469 vs 472, 463 vs 463); causal
    # 1-6% and D=64 2-5% slower (the skipped multiplications were not on their critical path, the branch is).
    # Folding the row max and sum in column halves first (independent chains instead of one per row, call 1's
    # profile: 13% of a consumer's samples on the max chain) lost everywhere, 1-8% (T045412, T045412-gpu1)
    # Session 16: 2-CTA clusters ("c"), FlashAttention-3's lever at this head_dim: two neighbouring query blocks, one
    # a CTA, each K/V tile read from L2 once for both (each CTA loads a column half, multicast to both; kernels/
    # multicast.py).  An upper bound first (bench/power_probe.py, logs s16run1: the producer loading only every other
    # round of the ring, wrong results, same compute): sustained 636 -> 659 and 627 -> 652 TFLOP/s at 16k, the
    # clock 1665 -> 1695 MHz under the same 690 W.  Clusters with cluster-scope remote arrivals lost 13-15% (run
    # 20261130T095112); with CTA-scope arrivals (as CUTLASS's), beside the table, run 20261130T095414 (bf16),
    # TFLOP/s at S=1k..16k: 573/619/642/644/655 against 555/598/622/644/655; power_probe at 16k sustained 644 against
    # 631 (1710 against 1650 MHz), a single call 729 against 732.  In the final grid's call (run 20261130T100533,
    # against the rows without clusters): 576/623/650/637/653 against 560/603/626/636/651.  At 8k and 16k keys the
    # row below gained 0.3% from clusters; with this row's config there instead (run 20261130T100920, bf16, one
    # GPU), 677/685 against 647/658 (Q in registers beside the split tail 661/677, with 3 stages 660/666), and the
    # table took it up to 16k keys.  Session 17's grids (runs 20261130T105315, T111650): 8k/16k 655/658 and 652/658
    # bf16; beside the previous 8k-16k row in one call (T105659) 654/657 against 631/643.  On top of this row (runs
    # 20261130T110348, T110446 bf16 and T110506-gpu1, T110556-gpu1 fp16, each list twice, the second time
    # reversed): the split tail lost 1-4%; head groups of 2 even within noise (+0.3%), of 8 -1%; two names for this
    # same config differed by up to 3%
    # Session 18: head groups of 2 instead of 4 (bench/gpu_s18a.sh, logs s18run1): sustained at 16k 653 against 647
    # TFLOP/s (groups of 3: 652, head-major: 651; the same rate per clock, at 1695 against 1680 MHz under the same
    # 690 W: fewer heads' K/V at once in L2 draw less power); grid cells even, 1k-16k bf16 and fp16, two rounds each
    # Session 19, on this row, each reverted (docs/PERF.md): a V ring of 3 (f244968; 224 KiB with O's own buffer)
    # sustained 648 against 645/650, one call 730 against 732; clusters of four CTAs (255b86a) -5%: the H200 holds
    # 30 of them (120 SMs); the items' timeline (bench/trace_tail.patch) shows the split tail winning 2.7% of the
    # kernel at one clock and losing under the power cap, where an idle last round costs no energy
    (128, False, 16384, KernelConfig(128, 128, 4, 2, head_group=2, q_regs=1, fence=1, cluster=1, stale=1)),
    # (From here to the next row: experiments on the 8k-16k row before session 16, which was 128 rows, 2 stages,
    # split_tail, fence and lazy; m192n128 spills.)
    # split_tail ("k", the last round's items in pieces merged by LSE; 2048 items fill 15.5 rounds of 132
    # programs), run 20261130T010530 (bf16, S=1k..16k beside the table): 532/546/583/622/636 against
    # 527/568/589/613/623: taken past 4k keys (at 2k-4k a piece's own prologue and store outweighed the
    # idle time); at D=64 (192 rows, 2752 items: 85% of the last round busy) 502 against 513 at 16k; at
    # 128k 611 against the row below's 629 (T011545).
    # 192-key tiles (FlashAttention-4's sm_90 tile here; Gluon's shapes are powers of two, so two ring slots of
    # 128 and 64 keys, a wgmma and a TMA box each: commit 61862e8, reverted) lost at every length, run
    # 20261130T060336 (bf16), TFLOP/s at S=512..16k against the table's 482/556/601/621/645/653: 354/430/521/561/
    # 615/626 without the fence, 355/434/531/572/612/627 also without lazy, 318-588 with both (spills); fp16
    # (T060048-gpu1) alike, 600 against 633 at 16k; D=64 in 128 x 192 tiles 460 against 532 (T060249-gpu1).  The
    # second Q K^T re-reads Q from shared memory (one N=192 wgmma would not), and ptxas spills around the loop.
    # The last round's key tiles dealt out as equal runs (stream-K, an item in up to 3 pieces at 16k keys, commit
    # cc6c90e, reverted) against its items in 7 equal pieces, same call (runs 20261130T061613 / T061652-old /
    # T061730, bf16, new/old/new): 636/635/636 at 16k, 623/624/622 at 8k; fp16 alike (T061420-gpu1 ...).
    # A K ring one slot deeper than V's (3 K, 2 V: K loads a tile further ahead, O still staged; commit 0f987c9,
    # reverted) lost, run 20261130T062433 (bf16), TFLOP/s at S=512..16k: 487/566/605/628/641/651 against
    # 494/568/608/630/649/664; fp16 (T062114-gpu1) 613 against 634 at 16k; causal (T062215-gpu1) and D=64
    # (T062305-gpu1) even or slower.
    # Chained items (an item's tile 0, Q K^T and softmax, run beside the previous item's last P V, its epilogue
    # after them: commits 166cfd8 and bdaf0d4, reverted; GPU tests passed) lost at every length, more the shorter
    # the items, run 20261130T072717 (bf16), TFLOP/s at S=512..16k against the table's 478/551/594/614/635/646:
    # 457/529/577/601/628/633, with Q in registers 457/527/578/607/633/645; causal (T072718-gpu1) 1-7% and D=64
    # non-causal (T072812-gpu1) 0-4% slower.  Carried over narrowed, P was copied into P V's operand registers
    # at every key step (32 moves, run T071459: 627 at 16k); carried in float32 it was not, and still lost.
    # Nor was it the next Q: loaded during the item's key loop (q_ahead, with Q in registers; commit 44e389f,
    # reverted), run 20261130T075050: alone 464/550/594/611/641/645 at S=512..16k against 484/554/599/622/642/655,
    # chained 461/542/592/614/643/650; causal (T075050-gpu1) alone within 2%, chained 1-8% slower.
    # 192 rows in 64-key tiles (1.5x the FLOPs per K/V byte from L2), run 20261130T073657-gpu1: 630 (3 stages
    # 625) against 636 at 8k, 637 (638) against 651 at 16k: Q K^T's m64n64k16 products read Q and K from shared
    # memory at about its bandwidth.
    # Session 15, each beside the table in one call, bf16, TFLOP/s at S=512..16k (reverted; logs s15run1-5):
    # the row sums from the tensor cores (P times a 128 x 8 block of ones, eight m64n8k16 wgmmas behind each P V,
    # instead of 64 adds a thread a tile; the loop's SASS 479 -> 430 instructions; commit 3290848), run
    # 20261130T082525: 469/555/594/614/619/631 against 486/558/599/621/635/654, causal (T082526-gpu1) 1-3% slower,
    # D=64 (T082621-gpu1) even.  Ping-pong turns at hardware named barriers (bar.sync / bar.arrive, FlashAttention-
    # 3's warp scheduler barrier; commit d260c9a), run T084034: 466/534/578/603/621/626 against 465/538/578/608/622/
    # 639, the mbarrier turns 461/530/565/598/613/620; causal and D=64 even.  One program per item (persistent=0,
    # FlashAttention-4's sm_90 schedule), run T084525: 397/488/552/589/611/622 against 474/544/587/609/632/639,
    # with the named-barrier turns 399/487/547/585/618/622.  The turns without the overlap inside a warpgroup
    # (commit 63aed0d), which let 192 rows fit in 160 registers (17 spill instructions in the loop): 192/175/191/
    # 190/375/379 against 484/555/600/625/639/653 (T084937; GPU tests passed), 128 rows 484/536/572/594/614/624.
    # D=128 past 16k keys: 3 K/V stages, O then stored from registers (no room to stage it).  Against 2
    # stages, same run (bf16 20261129T224118, fp16 T224319, extra grid T224215-gpu1), TFLOP/s s3/s2:
    # non-causal 512..16k 412/488 510/610 576/589 606/619 618/633 631/640, 128k 627/598; causal 512..16k
    # 269/316 .. 604/612, 128k 626/617.  Slower up to 16k (the register store of O costs more than the
    # deeper ring gains while a head's K/V sit in L2), faster at 128k (a head's K/V, 64 MB, do not).
    # Session 20, the standing pivot at 128k keys (extra grid, bf16): 656 against 631 (run 20261130T144014), 655
    # against 623 (T145238, the row with it against without)
    (128, False, None, KernelConfig(128, 128, 4, 3, q_regs=1, fence=1, stale=1)),
    # up to 512 keys: 64-row programs, two on an SM (three do not fit in shared memory at D=128), 64-key
    # tiles: 314 against 305 (bf16, run 20261130T031922; cuDNN 302), 297 against 290 (fp16, T031923-gpu1;
    # cuDNN 285); from 1k keys 383/428/457/471/479 against 422/513/564/598/613 (bf16), and non-causal 409-523
    # against 478-634
    # Session 20, the standing pivot: 320 against 314 (bf16), 310 against 304 (fp16); from 1k keys 3-6% slower
    (128, True, 512, KernelConfig(64, 64, 4, 2, q_regs=1, occupancy=2, stale=1)),
    # Session 19: 2-CTA clusters here too (both CTAs on the second block's key tiles; ad814c2, reverted), runs
    # 20261130T134037-gpu1 and T134223: 628/606/620 against 625/600/614 at 16k (bf16, fp16, bf16 reversed), 2-7%
    # slower at 1k-4k, even at 8k; with the fence 5-9% slower
    (128, True, 16384, KernelConfig(128, 128, 4, 2, q_regs=1)),
    (128, True, None, KernelConfig(128, 128, 4, 3, q_regs=1)),
]


def hopper_config(head_dim: int, causal: bool, seqlen_k: int, modifiers: bool = False,
                  per_sequence: bool = False, seqlen_q: int = 0) -> KernelConfig:
    """The ``hopper`` entry for this shape (head dims other than 64 take the 128 rows; with
    ``per_sequence`` lengths, varlen or seqused_k, ``seqlen_k`` is the longest).  With a window,
    softcap or ALiBi, or key lengths off the key tile (per sequence: any), 192 rows become 128:
    three consumer warpgroups at 160 registers spill on the extra live values (up to 117
    registers with the modifiers, 48 stores with the ragged key mask, sm_90 build), two at 240
    do not.  With the modifiers at D=128, Q stays in shared memory (in registers, 23 spilled
    registers with window, softcap and ALiBi, causal); with them or lengths per sequence, no
    clusters (``hopper.supports``), nor where ``seqlen_q`` (0: not known) makes an odd number of
    query blocks (FlashAttention-3's rule): a cluster runs two blocks, and the partner of a last
    lone block would compute rows that do not exist (a 2x loss where a head has one block)."""
    d = 64 if head_dim == 64 else 128
    for key_d, key_causal, longest, cfg in HOPPER:
        if key_d == d and key_causal == bool(causal) and (longest is None or seqlen_k <= longest):
            narrow = modifiers or per_sequence or seqlen_k % cfg.block_n
            if modifiers and d == 128:
                cfg = replace(cfg, q_regs=0)
            if modifiers or per_sequence or -(-seqlen_q // cfg.block_m) % 2:
                cfg = replace(cfg, cluster=0)
            return replace(cfg, block_m=128) if narrow and cfg.block_m == 192 else cfg
    raise AssertionError("the HOPPER table ends with an open row for every (head_dim, causal)")


def decode_config(rows: int, seqlen_k: int, head_dim: int = 128) -> KernelConfig:
    """Decoding (keys split over programs): a block just big enough for the program's query
    rows (seqlen_q, times the GQA group when packed), 16 to 64; memory-bound, so mma.sync
    tiles suffice.  One query block: as many splits as fill each SM once (f1).  `fmha sweep
    --variant tiled --grid decode --where seqlen_q=1` (run 20261129T193149, 4 query rows,
    TFLOP/s at 1k / 8k / 32k / 128k keys; cuDNN 7.8/14.4/17.1/18.0 in run T193249):
    m16n64w4s4f1 7.3/14.2/17.0/17.9, m16n64w4s3f1 7.5/13.7/16.3/17.1, m16n128w4s4f1
    5.9/13.9/16.8/18.0, the session-4 choices (f2, or 4 programs per SM at 32k and 128k) 1-7%
    behind from 8k.  bench/decode_splits.py in the same call: 4 splits (1 per SM here) best at
    32k and 128k, 8 at 8k by 1%; more programs per SM only share the same bandwidth.  K/V by TMA
    (``tma=1``; the caller drops it where the call cannot take it), against the same configs
    without, run 20261129T230027 (bf16, GQA 32/8, cuDNN in the same run), us at 1k / 8k / 32k /
    128k keys: 1 query row 8.30/37.86/126.35/479.91 against 8.92/37.93/125.89/478.66; 4 rows
    3.5-7% faster, 16 rows 0-4.5%.  From 8k keys, 128-key tiles in 3 stages (192 KB in flight, cuDNN's
    tile: call 1 of session 12 profiled its 16 x 128 tiles, two 86 KB programs an SM) against the
    m16n64s4 before (128 KB), run 20261130T051803 (bf16), us at 8k / 32k / 128k keys: 37.08/125.36/
    476.72 against 37.90/126.21/479.84 (cuDNN 37.23/126.18/480.39); 6 or 5 stages of 64 keys 1.5-6%
    slower, 2 stages of 128 keys 8-14% slower (T051803-gpu1); at 1k keys 9.06 against 8.30.  Past
    head_dim 128 the 64-key tiles keep 3 stages (4 would need 256 KB)."""
    block_m = min(64, max(16, 1 << (rows - 1).bit_length()))
    if block_m > 16:
        return KernelConfig(block_m, 64, 4, 3, tma=1)
    if seqlen_k >= 8192 and head_dim <= 128:
        return KernelConfig(16, 128, 4, 3, split_per_sm=1, tma=1)
    return KernelConfig(16, 64, 4, 3, split_per_sm=1, tma=1)


def tiled_config(arch: str, head_dim: int) -> KernelConfig:
    """The ``tiled`` entry for ``arch`` at ``head_dim`` (padded to a power of two)."""
    for key, max_d, cfg in TILED:
        if key == arch and head_dim <= max_d:
            return cfg
    for key, max_d, cfg in TILED:  # an arch not in the table takes the sm80 rows
        if key == "sm80" and head_dim <= max_d:
            return cfg
    raise ValueError(f"no tiled config for arch={arch!r}, head_dim={head_dim}")


def default_config(variant: str, arch: str, head_dim: int, causal: bool = False, seqlen_k: int = 0,
                   modifiers: bool = False, per_sequence: bool = False, seqlen_q: int = 0) -> KernelConfig:
    if variant in ("singlewave", "pipelined"):
        return SEED
    if variant == "tiled":
        return tiled_config(arch, head_dim)
    if variant == "hopper":
        return hopper_config(head_dim, causal, seqlen_k, modifiers, per_sequence, seqlen_q)
    raise ValueError(f"no config table for variant {variant!r}")
