//! The heap's pages: giving freed ones back to the system, and their size.
//!
//! The process allocator (mimalloc) keeps the pages of freed blocks for reuse and returns them
//! lazily, only when the thread that freed them allocates again; a data core that read large
//! request bodies and then went quiet held their pages for good. After it frees a grown buffer
//! a core asks for them to be returned now.
//!
//! mimalloc asks for transparent huge pages on its arenas (`MADV_HUGEPAGE`), so the first touch
//! of each fresh 2 MiB region zeroes all of it. The control core and the mesh thread touch fresh
//! memory with every new path they learn (tree nodes, the mesh's maps), and that zeroing was
//! about half of the mesh thread's CPU per dispatch at 4 meshed gateways
//! (`perf/results-mesh.md`, "the heap's huge pages"). At start the gateway keeps its heap on
//! small pages unless the operator sets `MIMALLOC_ALLOW_THP`.

use std::io;

/// Returns the calling thread's free pages to the system. A walk of the thread's heap: called
/// after a large buffer is freed (at most once per `MEMORY_RETURN_DELAY` per core), never per
/// request.
pub fn return_freed_pages() {
    // SAFETY: `mi_collect` takes no pointer and has no precondition; it only walks and trims the
    // calling thread's own heap, which no other thread touches. When mimalloc is not the global
    // allocator (unit tests) its heap is empty and the call does nothing.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// What [`keep_heap_on_small_pages`] did.
#[derive(Debug)]
pub enum HeapPages {
    /// Transparent huge pages are off for this process: each page is zeroed when first touched.
    Small,
    /// `MIMALLOC_ALLOW_THP` is set: the operator's choice, left to mimalloc.
    AsConfigured,
    /// The kernel refused (`prctl`); the heap stays as mimalloc set it.
    Refused(io::Error),
}

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`: the kernel then
/// backs every mapping, the arenas mimalloc advised too, with small pages), unless the operator
/// set `MIMALLOC_ALLOW_THP`. Called first thing at start, before the index is built.
pub fn keep_heap_on_small_pages() -> HeapPages {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return HeapPages::AsConfigured;
    }
    // SAFETY: `PR_SET_THP_DISABLE` takes integers only and sets a flag of this process's memory
    // map, read by the kernel at each later page fault; no pointer is passed or kept.
    match unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } {
        0 => HeapPages::Small,
        _ => HeapPages::Refused(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heap_is_kept_on_small_pages_unless_the_operator_allows_huge_ones() {
        let outcome = keep_heap_on_small_pages();
        // SAFETY: `PR_GET_THP_DISABLE` takes integers only and reads this process's flag.
        let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        match outcome {
            HeapPages::Small => assert_eq!(disabled, 1),
            HeapPages::AsConfigured => assert!(std::env::var_os("MIMALLOC_ALLOW_THP").is_some()),
            HeapPages::Refused(e) => panic!("prctl(PR_SET_THP_DISABLE) refused: {e}"),
        }
    }

    #[test]
    fn returning_pages_leaves_live_blocks_intact() {
        let live: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 << 10]).collect();
        drop(vec![0u8; 8 << 20]);
        return_freed_pages();
        return_freed_pages();
        for (i, block) in live.iter().enumerate() {
            assert!(block.iter().all(|&b| b == i as u8));
        }
    }
}
