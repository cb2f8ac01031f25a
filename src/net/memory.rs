//! Giving freed memory back to the system. The process allocator (mimalloc) keeps the pages of
//! freed blocks for reuse and returns them lazily, only when the thread that freed them
//! allocates again; a data core that read large request bodies and then went quiet held their
//! pages for good. After it frees a grown buffer a core asks for them to be returned now.

/// Returns the calling thread's free pages to the system. A walk of the thread's heap: called
/// after a large buffer is freed (at most once per `MEMORY_RETURN_DELAY` per core), never per
/// request.
pub fn return_freed_pages() {
    // SAFETY: `mi_collect` takes no pointer and has no precondition; it only walks and trims the
    // calling thread's own heap, which no other thread touches. When mimalloc is not the global
    // allocator (unit tests) its heap is empty and the call does nothing.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;

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
