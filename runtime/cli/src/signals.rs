//! SIGINT and SIGTERM during a write: the temporary file of an atomic write in progress (a
//! 200 MB checkpoint of `train --save`) is removed before the process ends as the signal's
//! default would end it. SIGKILL cannot be caught; the next write to that file removes what
//! it left (`tracepass_ir::fsio::write_atomic`).

/// Starts a thread that waits for SIGINT or SIGTERM, removes the temporary files of writes in
/// progress, then ends the process by the signal's default action (so its exit status still
/// says which signal ended it). Without it, nothing would remove them.
#[cfg(unix)]
pub fn remove_temp_files_on_signal() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        // the signals keep their default action: only the temporary files are at stake
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracepass_ir::fsio::remove_temp_files();
                let _ = signal_hook::low_level::emulate_default_handler(sig);
                // the default action of both is to end the process; should it return, exit
                std::process::exit(128 + sig);
            }
        });
    drop(spawned);
}

#[cfg(not(unix))]
pub fn remove_temp_files_on_signal() {}
