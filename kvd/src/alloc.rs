//! How kvd's allocator (mimalloc, the binary's global allocator) gives memory back.
//!
//! mimalloc returns a span of freed pages to the OS (`MADV_DONTNEED`) only after its purge
//! delay (1 s as built here: `mi_option_get` says 1000 ms); under churn (a store at
//! `--max-memory` evicting values of mixed sizes, clients' large buffers freed as they
//! disconnect) the freed spans are reused or re-delayed before the delay runs out, and RSS
//! stayed at twice the cap and more (docs/MEMORY.md, "RSS under churn"). Under
//! `--max-memory` kvd purges at once: measured, RSS 5 s after a flood of mixed sizes against
//! a 64 MB cap went from 127-143 MB to 67-70 MB, at no cost to the headline workload's op/s.
//!
//! Not without a cap: every big buffer freed is then faulted in again when the next one is
//! allocated, and a replica group's appends of 20 MiB values, which openraft 0.9 must finish
//! within a heartbeat (75 ms), stopped making it on a busy machine (a member added after
//! big values never caught up). An operator's own `MIMALLOC_PURGE_DELAY` is left as given.

/// mimalloc 2.x's `mi_option_purge_delay` (the enum's 16th member; a test checks that
/// `MIMALLOC_PURGE_DELAY` lands there, so a renumbering in a new mimalloc is caught).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc give freed memory back to the OS at once (see the module docs). Call
/// before the node starts allocating.
pub fn purge_freed_memory_at_once() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: sets one of mimalloc's options, which it reads on every purge decision.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

/// The purge delay mimalloc uses now, in ms.
pub fn purge_delay_ms() -> std::os::raw::c_long {
    // SAFETY: reads one of mimalloc's options.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    /// The option number is mimalloc's purge delay: a copy of this test run with
    /// `MIMALLOC_PURGE_DELAY=777` (which mimalloc reads into that option at start) reads 777
    /// through it; and setting it takes.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("KVD_ALLOC_TEST_CHILD").is_some() {
            println!("purge_delay={}", super::purge_delay_ms());
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "alloc::tests::the_purge_delay_option_is_the_one_set",
                "--exact",
                "--nocapture",
            ])
            .env("KVD_ALLOC_TEST_CHILD", "1")
            .env("MIMALLOC_PURGE_DELAY", "777")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("purge_delay=777"), "{text}");
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            super::purge_freed_memory_at_once();
            assert_eq!(super::purge_delay_ms(), 0);
        }
    }
}
