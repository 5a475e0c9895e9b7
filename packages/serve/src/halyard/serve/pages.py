"""`PageAllocator`: which KV pages each sequence owns, reference counts, and the prefix cache (no JAX).

Memory is ``num_pages`` pages of ``page_size`` token slots (the engine's pool). A sequence owns the pages
that hold its positions in order; a page can be shared by several sequences (the ``n`` samples of one
prompt, or any requests with a common prefix) and is counted once per owner. A *full* page can be
registered in the prefix cache under its content: the tokens it holds and the page before it (so a key
names the whole prefix, exactly: no hash can collide). When its last owner leaves, a cached page is not
freed but kept, least recently used first in line for reuse; reusing it drops it from the cache, with
every cached page that continued it. Pages of a sequence that ends or is cancelled are released at once.

The memory used is the live tokens rounded up to pages (each sequence's last page is partly filled),
plus cached pages that nobody owns, which any new sequence takes back before it could run out.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Hashable, Sequence

PrefixKey = tuple[int, tuple[int, ...]]
"""A cached page's key: ``(the page before it, or its owner's root for the first, the page's tokens)``: the
root is -1, or another negative number for prefixes that must not meet (`halyard.serve.scheduler.prefix_root`:
one per LoRA adapter)."""


class OutOfPages(RuntimeError):
    """Not enough free pages; nothing was changed."""


@dataclasses.dataclass
class _Owned:
    pages: list[int]
    capacity_tokens: int
    registered: int = 0  # leading pages cached under this owner's tokens: `register` starts after them
    epoch: int = 0  # the allocator's ``_owned_uncached`` when ``registered`` was counted
    root: int = -1  # the key of its first page's "page before" (`PrefixKey`)


class PageAllocator:
    """Pages, owners and the prefix cache; see the module docstring.

    Args:
        num_pages: pages in the pool.
        page_size: token slots per page.

    Raises:
        ValueError: ``num_pages`` or ``page_size`` below 1.
    """

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"PageAllocator needs num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}"
            )
        self.num_pages = num_pages
        self.page_size = page_size
        self._references = [0] * num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() hands out page 0 first
        self._cached_unowned: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._key_of: dict[int, PrefixKey] = {}
        self._page_of: dict[PrefixKey, int] = {}
        self._continuations: dict[int, set[int]] = {}
        self._owners: dict[Hashable, _Owned] = {}
        self._owned_uncached = 0  # times an owned page left the cache (owners' ``registered`` counts restart)

    # -- questions ---------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Pages a new allocation can take: free ones and cached ones nobody owns."""
        return len(self._free) + len(self._cached_unowned)

    @property
    def in_use(self) -> int:
        """Pages owned by at least one sequence."""
        return self.num_pages - self.available

    @property
    def cached(self) -> int:
        """Pages registered in the prefix cache (owned or not)."""
        return len(self._key_of)

    def pages_of(self, owner: Hashable) -> list[int]:
        """The pages of ``owner`` in position order (a copy)."""
        return list(self._owners[owner].pages)

    def owners(self) -> list[Hashable]:
        """Every sequence that owns pages."""
        return list(self._owners)

    def references(self, page: int) -> int:
        """How many sequences own ``page``."""
        return self._references[page]

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.page_size)

    def cached_prefix(self, tokens: Sequence[int], *, limit: int | None = None, root: int = -1) -> list[int]:
        """The cached pages holding the longest prefix of ``tokens`` in whole pages.

        Args:
            tokens: the sequence's tokens.
            limit: at most this many tokens may come from the cache (the engine keeps the last prompt
                token to compute, for its logits).
            root: the prefixes' root (`PrefixKey`): only pages registered under it are found.
        """
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        pages: list[int] = []
        previous = root
        for start in range(0, limit - self.page_size + 1, self.page_size):
            page = self._page_of.get((previous, tuple(tokens[start : start + self.page_size])))
            if page is None:
                break
            pages.append(page)
            previous = page
        return pages

    # -- changes -----------------------------------------------------------------------------------
    def add(self, owner: Hashable, shared: Sequence[int] = (), *, root: int = -1) -> None:
        """Register a new sequence that starts with the (cached or owned) pages ``shared``; its pages are
        cached under ``root`` (`PrefixKey`).

        Raises:
            KeyError: ``owner`` already owns pages.
            ValueError: a page of ``shared`` is neither owned nor cached (it could hold anything).
        """
        if owner in self._owners:
            raise KeyError(f"sequence {owner!r} is already in the page allocator")
        for page in shared:
            if self._references[page] == 0 and page not in self._cached_unowned:
                raise ValueError(f"page {page} is neither owned nor cached: it cannot be shared")
        for page in shared:
            self._take(page)
        self._owners[owner] = _Owned(
            list(shared), len(shared) * self.page_size, epoch=self._owned_uncached, root=root
        )

    def reserve(self, owner: Hashable, num_tokens: int) -> None:
        """Make ``owner``'s pages hold at least ``num_tokens`` tokens, taking new pages as needed.

        Raises:
            OutOfPages: fewer pages are available than needed (nothing changed).
        """
        owned = self._owners[owner]
        needed = self.pages_for(num_tokens) - len(owned.pages)
        if needed <= 0:
            return
        if needed > self.available:
            raise OutOfPages(f"sequence {owner!r} needs {needed} more pages, {self.available} available")
        for _ in range(needed):
            page = self._free.pop() if self._free else self._evict_oldest()
            self._references[page] = 1
            owned.pages.append(page)
        owned.capacity_tokens = len(owned.pages) * self.page_size

    def register(self, owner: Hashable, tokens: Sequence[int], written: int | None = None) -> None:
        """Enter ``owner``'s full pages in the prefix cache, given the tokens now written in its pages.

        Pages already cached keep their key. A full page whose content another cached page already holds
        stays private (one cached page per prefix). The pages an earlier call found cached under these
        tokens are not looked at again (an engine registers every running sequence at every step).

        Args:
            owner: the sequence.
            tokens: its tokens, in order (the same list at every call, only ever grown).
            written: how many of ``tokens`` its pages hold (default all of them).
        """
        owned = self._owners[owner]
        if owned.epoch != self._owned_uncached:
            owned.registered, owned.epoch = 0, self._owned_uncached
        size = self.page_size
        full = min((len(tokens) if written is None else min(written, len(tokens))) // size, len(owned.pages))
        first = owned.registered
        if full <= first:
            return  # no page filled up since the last call (a decoding row's usual step)
        previous = owned.pages[first - 1] if first else owned.root
        for index in range(first, full):
            page = owned.pages[index]
            key = (previous, tuple(tokens[index * size : (index + 1) * size]))
            if page in self._key_of:
                if self._key_of[page] != key:
                    return  # this page was registered under another prefix: the chain ends here
            elif key in self._page_of:
                return
            else:
                self._key_of[page] = key
                self._page_of[key] = page
                self._continuations.setdefault(previous, set()).add(page)
            owned.registered = index + 1
            previous = page

    def truncate(self, owner: Hashable, num_tokens: int) -> None:
        """Give back ``owner``'s pages past the first ``num_tokens`` tokens' (a speculative step's rejected
        tokens: never registered, since their keys and values are not the sequence's)."""
        owned = self._owners[owner]
        keep = max(self.pages_for(num_tokens), owned.registered)
        for page in owned.pages[keep:]:
            self._references[page] -= 1
            if self._references[page] == 0:
                self._free.append(page)
        del owned.pages[keep:]
        owned.capacity_tokens = len(owned.pages) * self.page_size

    def release(self, owner: Hashable) -> None:
        """Drop ``owner``: each of its pages loses one owner; an unowned page is freed, or kept in the
        prefix cache when registered there."""
        owned = self._owners.pop(owner)
        for page in owned.pages:
            self._references[page] -= 1
            if self._references[page] == 0:
                if page in self._key_of:
                    self._cached_unowned[page] = None
                else:
                    self._free.append(page)

    def clear_cache(self) -> None:
        """Forget every cached prefix (pages nobody owns become free)."""
        for page in list(self._key_of):
            self._uncache(page)

    # -- internals ---------------------------------------------------------------------------------
    def _take(self, page: int) -> None:
        if self._references[page] == 0:
            del self._cached_unowned[page]
        else:
            self._cached_unowned.pop(page, None)
        self._references[page] += 1

    def _evict_oldest(self) -> int:
        page = next(iter(self._cached_unowned))
        self._uncache(page)  # frees it, with the unowned cached pages that continued it
        self._free.remove(page)
        return page

    def _uncache(self, page: int) -> None:
        """Drop ``page`` and every cached page that continues it from the cache."""
        stack = [page]
        while stack:
            current = stack.pop()
            key = self._key_of.pop(current, None)
            if key is None:
                continue
            del self._page_of[key]
            if self._references[current]:
                self._owned_uncached += 1
            self._continuations.get(key[0], set()).discard(current)
            stack.extend(self._continuations.pop(current, ()))
            if current in self._cached_unowned:
                del self._cached_unowned[current]
                self._free.append(current)

    def check(self) -> None:
        """Assert the table's invariants (for tests): every page is free, cached-unowned or owned, never
        two of these; reference counts equal the owners holding each page; cache maps are inverse."""
        counts = [0] * self.num_pages
        for owned in self._owners.values():
            assert len(set(owned.pages)) == len(owned.pages), "a sequence holds a page twice"
            for page in owned.pages:
                counts[page] += 1
        assert counts == self._references, "reference counts differ from the owners"
        free = set(self._free)
        assert len(free) == len(self._free), "a page is free twice"
        unowned = set(self._cached_unowned)
        for page in range(self.num_pages):
            states = (page in free) + (page in unowned) + (counts[page] > 0)
            assert states == 1, f"page {page} is in {states} states"
        assert unowned <= set(self._key_of), "an unowned cached page has no key"
        assert not (free & set(self._key_of)), "a free page is still cached"
        assert {v: k for k, v in self._page_of.items()} == self._key_of, "cache maps disagree"
        for owned in self._owners.values():
            if owned.epoch == self._owned_uncached:
                chain = [owned.root, *owned.pages[: owned.registered]]
                keys = [self._key_of.get(page, (None,))[0] for page in chain[1:]]
                assert keys == chain[:-1], (
                    "a page counted as registered is not cached after the one before it"
                )
