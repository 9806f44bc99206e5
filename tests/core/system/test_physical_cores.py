"""Physical cores from the OS's sibling lists, over a given affinity set, on a
fake /sys/devices/system/cpu tree."""

from __future__ import annotations

import os

import pytest

from chatterm.core.system.machine import physical_cores, usable_cpus


def sys_tree(root, siblings: dict[int, str], name: str = "core_cpus_list"):
    """cpuN/topology/<name> holding siblings[N] for each CPU."""
    for cpu, text in siblings.items():
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / name).write_text(text + "\n")
    return root


SMT_4X2 = {0: "0,4", 1: "1,5", 2: "2,6", 3: "3,7", 4: "0,4", 5: "1,5", 6: "2,6", 7: "3,7"}


def test_hardware_threads_of_one_core_count_once(tmp_path):
    root = sys_tree(tmp_path, SMT_4X2)
    assert physical_cores(range(8), root) == 4


def test_only_the_cores_of_the_affinity_set_count(tmp_path):
    root = sys_tree(tmp_path, SMT_4X2)
    assert physical_cores({0, 4}, root) == 1  # both threads of one core
    assert physical_cores({0, 1}, root) == 2  # one thread each of two cores
    assert physical_cores({2}, root) == 1


def test_ranges_in_sibling_lists(tmp_path):
    root = sys_tree(tmp_path, {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3", 4: "4", 5: "5"})
    assert physical_cores(range(6), root) == 4


def test_the_older_thread_siblings_list_is_read_when_core_cpus_list_is_missing(tmp_path):
    root = sys_tree(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}, name="thread_siblings_list")
    assert physical_cores(range(4), root) == 2


def test_without_smt_every_cpu_is_a_core(tmp_path):
    root = sys_tree(tmp_path, {0: "0", 1: "1"})
    assert physical_cores({0, 1}, root) == 2  # no halving guess


@pytest.mark.parametrize("broken", ["", "garbage", "3-x"])
def test_a_missing_or_unreadable_list_counts_the_cpu_as_its_own_core(tmp_path, broken):
    root = sys_tree(tmp_path, {0: "0,1", 1: "0,1", 2: broken})  # no cpu3 folder at all
    assert physical_cores({0, 1, 2, 3}, root) == 3
    assert physical_cores({0, 1, 2, 3}, tmp_path / "no-sys") == 4


def test_a_list_that_does_not_name_its_own_cpu_is_not_trusted(tmp_path):
    root = sys_tree(tmp_path, {0: "0,1", 1: "0"})
    assert physical_cores({0, 1}, root) == 2


def test_this_process_gets_at_least_one_core_and_no_more_than_its_cpus():
    cpus = usable_cpus()
    if hasattr(os, "sched_getaffinity"):
        assert cpus == os.sched_getaffinity(0)
    assert 1 <= physical_cores() <= len(cpus)
