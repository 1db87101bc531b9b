"""Payload bytes by unified place (payload mode), stored in pages allocated on first write.

A page holds PAGE consecutive places' rows (all layers). `page_of[place >> PAGE_BITS]` names a place's page in
storage; 0 is a page of zeros that is never written (what a place reads before any write), so memory follows the
places written -- the entries held -- not the budget's places. Storage grows x2 in pages; rows keep their position.
"""
from __future__ import annotations

import numpy as np

PAGE_BITS = 12
PAGE = 1 << PAGE_BITS


class PayloadStore:
    def __init__(self, num_places: int, layers: int, row_bytes: int):
        self.page_of = np.zeros(-(-max(num_places, 1) // PAGE), dtype=np.int64)
        self.data = np.zeros((2 * PAGE, layers, row_bytes), dtype=np.uint8)  # page 0: the zero page
        self.num_pages = 1

    def rows(self, places: np.ndarray) -> np.ndarray:
        """Storage rows of places to read (unwritten pages read the zero page)."""
        return self.page_of.take(places >> PAGE_BITS) * PAGE + (places & (PAGE - 1))

    def rows_to_write(self, places: np.ndarray) -> np.ndarray:
        """Storage rows of places to write, pages allocated (zeroed) on first use. May re-allocate `data`."""
        pages = np.unique(places >> PAGE_BITS)
        new = pages[self.page_of.take(pages) == 0]
        if new.size:
            need = (self.num_pages + new.size) * PAGE
            if need > self.data.shape[0]:
                grown = np.zeros((max(need, 2 * self.data.shape[0]), *self.data.shape[1:]), dtype=np.uint8)
                grown[: self.num_pages * PAGE] = self.data[: self.num_pages * PAGE]
                self.data = grown
            self.page_of[new] = np.arange(self.num_pages, self.num_pages + new.size)
            self.num_pages += new.size
        return self.rows(places)

    def read(self, places: np.ndarray, layer: int) -> np.ndarray:
        return self.data[self.rows(places), layer]

    def write(self, places: np.ndarray, layer: int, values: np.ndarray) -> None:
        rows = self.rows_to_write(places)
        self.data[rows, layer] = values

    def copy_all_layers(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Every layer's bytes of places src -> dst (all reads first)."""
        rows = self.data[self.rows(src)]
        self.data[self.rows_to_write(dst)] = rows

    def dense(self, num_places: int) -> np.ndarray:
        """Every place's rows (num_places, layers, bytes): a budget-sized copy, for tests and checks only."""
        return self.data[self.rows(np.arange(num_places, dtype=np.int64))]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.page_of.nbytes)


__all__ = ["PAGE", "PayloadStore"]
