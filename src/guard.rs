//! Containing panics. A panic inside aim is a bug in aim; it must reach a host application
//! as an [`Error`](crate::Error), never unwind into it, and the user should see that one
//! error line rather than a panic message and a backtrace on stderr.
//!
//! [`contain`] runs a public entry point (load, run) under `catch_unwind` with a
//! thread-local flag set; the panic hook aim installs (once, wrapping whatever hook was
//! there) stays silent for panics on a thread inside `contain` or on aim's own worker
//! threads, and defers to the previous hook everywhere else. `AIM_SHOW_PANICS=1` shows them
//! (with the previous hook, so `RUST_BACKTRACE` works as usual) for debugging aim itself.
//! Tests still fail on such a bug: the error says "internal error", which no test accepts.

use std::cell::Cell;
use std::sync::Once;

thread_local! {
    /// How many `contain` calls this thread is inside.
    static INSIDE: Cell<usize> = const { Cell::new(0) };
}

static HOOK: Once = Once::new();

fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        let show = std::env::var_os("AIM_SHOW_PANICS").is_some_and(|v| v != "0");
        std::panic::set_hook(Box::new(move |info| {
            let ours = INSIDE.with(|c| c.get() > 0)
                || std::thread::current().name().is_some_and(|n| n.starts_with("aim-worker"));
            if show || !ours {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into [`Error::Internal`](crate::Error::Internal) about `what`.
pub(crate) fn contain<T>(what: &str, f: impl FnOnce() -> Result<T, crate::Error>) -> Result<T, crate::Error> {
    install_hook();
    INSIDE.with(|c| c.set(c.get() + 1));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    INSIDE.with(|c| c.set(c.get() - 1));
    r.unwrap_or_else(|p| Err(crate::Error::Internal { what: what.to_string(), msg: aim_runtime::panic_message(&*p) }))
}
