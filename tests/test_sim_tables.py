"""GroupTables: one address table shared by the groups while their caches agree, a group's own copy once it differs."""
import numpy as np
import pytest

from sim.policy import AddressTable
from sim.tables import GroupTables


def _rows(t: AddressTable, rid: int) -> np.ndarray:
    return t.table[t.row_of[rid], : t.length[rid]]


def test_groups_share_one_table_while_addresses_agree():
    tabs = GroupTables([0, 1, 2], lambda: AddressTable(16, np.int32))
    tabs.next_round()
    for g in (0, 1, 2):
        tabs.add(g, 7, np.arange(5))
    tabs.next_round()
    for g in (0, 1, 2):
        tabs.append(g, 7, np.array([9, 10]))
    assert tabs[0] is tabs[1] is tabs[2] and not tabs.own
    assert _rows(tabs[2], 7).tolist() == [0, 1, 2, 3, 4, 9, 10]


def test_a_group_whose_addresses_differ_gets_its_own_copy():
    tabs = GroupTables([0, 1, 2], lambda: AddressTable(16, np.int32))
    tabs.next_round()
    for g in (0, 1, 2):
        tabs.add(g, 1, np.arange(3))
    tabs.next_round()
    tabs.append(0, 1, np.array([5]))
    tabs.append(1, 1, np.array([6]))  # differs: forks
    tabs.append(2, 1, np.array([5]))
    tabs.next_round()
    for g, a in ((0, [20, 21]), (1, [30]), (2, [20, 21])):
        tabs.add(g, 2, np.array(a))
    assert tabs[0] is tabs[2] and tabs[1] is not tabs[0]
    assert _rows(tabs[0], 1).tolist() == [0, 1, 2, 5] and _rows(tabs[1], 1).tolist() == [0, 1, 2, 6]
    assert _rows(tabs[0], 2).tolist() == [20, 21] and _rows(tabs[1], 2).tolist() == [30]
    tabs.next_round()
    for g in (0, 1, 2):
        tabs.remove(g, 1)
    assert 1 not in tabs[0].row_of and 1 not in tabs[1].row_of
    tabs.next_round()  # a fork on a new request: the shared rows written this round are not in the copy
    tabs.add(0, 3, np.array([40]))
    tabs.add(2, 3, np.array([41]))
    assert 3 not in tabs[1].row_of and _rows(tabs[2], 3).tolist() == [41] and _rows(tabs[0], 3).tolist() == [40]
    tabs.drop(1)
    with pytest.raises(KeyError):
        tabs[1]


def test_a_fork_mid_round_keeps_only_what_the_group_wrote():
    """Group 1 differs on the second of three requests grown in one round: its copy holds its own first append,
    not the shared table's appends of the requests it has not reached yet."""
    tabs = GroupTables([0, 1], lambda: AddressTable(16, np.int32))
    tabs.next_round()
    for g in (0, 1):
        for rid in (1, 2, 3):
            tabs.add(g, rid, np.array([rid * 10]))
    tabs.next_round()
    for rid in (1, 2, 3):
        tabs.append(0, rid, np.array([rid * 10 + 1]))
    tabs.append(1, 1, np.array([11]))
    tabs.append(1, 2, np.array([99]))
    tabs.append(1, 3, np.array([31]))
    assert [_rows(tabs[1], r).tolist() for r in (1, 2, 3)] == [[10, 11], [20, 99], [30, 31]]
    assert [_rows(tabs[0], r).tolist() for r in (1, 2, 3)] == [[10, 11], [20, 21], [30, 31]]
