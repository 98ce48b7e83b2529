# ruff: noqa (model-written style, kept as is)
# entry: k_smallest_sorted_insert
# case: ([5, 1, 4, 2], 2, 3) -> [1, 2, 3]
import bisect
import heapq


def k_smallest_sorted_insert(xs, k, extra):
    smallest = heapq.nsmallest(k, xs)
    bisect.insort(smallest, extra)
    return smallest
