"""``--shard I/N`` (conftest): the suite in N fixed parts, for GPU calls shorter than the whole suite."""
import pytest

from conftest import in_shard


def test_shards_split_the_tests_into_disjoint_parts_that_cover_them():
    ids = [f"tests/test_gpu.py::test_case[{i}-{d}]" for i in range(200) for d in (64, 128)]
    for n in (1, 2, 3, 7):
        parts = [{x for x in ids if in_shard(x, f"{i}/{n}")} for i in range(1, n + 1)]
        assert sum(len(p) for p in parts) == len(ids) and set().union(*parts) == set(ids)
        if n > 1:  # every part takes a share, not one part all
            assert all(len(ids) / n / 2 < len(p) < 2 * len(ids) / n for p in parts)


@pytest.mark.parametrize("shard", ["0/3", "4/3"])
def test_a_shard_outside_its_count_is_refused(shard):
    with pytest.raises(pytest.UsageError):
        in_shard("tests/test_api.py::test_x", shard)
