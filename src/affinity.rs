//! Which request thread is running: a small number per thread, so that per-thread connections (the
//! upstream pool's, the Redis store's lanes) stay with the thread whose runtime drives them.
//!
//! A connection's task runs on the runtime that opened it. tollgate serves requests from one
//! single-threaded runtime per core (`App::run`); a request that uses a connection of its own thread
//! wakes no other thread.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The calling thread's number: given on first use, counting from 0, fixed for the thread's life.
pub fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

#[cfg(test)]
mod tests {
    use super::thread_index;

    #[test]
    fn a_thread_keeps_its_number_and_threads_differ() {
        let here = thread_index();
        assert_eq!(thread_index(), here);
        let there = std::thread::spawn(thread_index).join().expect("thread");
        assert_ne!(there, here);
    }
}
