//! Gives every thread rank an equal share of the machine. Left to the OS, four rank threads on
//! two cores do not share them evenly: the scheduler may keep one rank alone on a core while
//! three share the other, so that rank runs a whole backward ahead and every collective waits
//! for the slowest. Pinning rank `r` to the `r mod n`-th CPU the process may use (as launchers
//! bind one process per GPU to its CPUs) keeps the ranks' progress even.

/// Pins the calling thread to the CPU for `rank`; returns that CPU, or why it could not.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(rank: usize) -> Result<usize, String> {
    let allowed = allowed_cpus()?;
    let Some(&cpu) = allowed.get(rank % allowed.len().max(1)) else {
        return Err("the process may run on no CPU".into());
    };
    // SAFETY: `cpu_set_t` is plain data; the call sets the calling thread's mask (pid 0)
    // from a set of the size passed.
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) != 0 {
            return Err(format!(
                "sched_setaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(cpu)
}

/// The CPUs the calling thread may run on.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Result<Vec<usize>, String> {
    // SAFETY: `cpu_set_t` is plain data; the call fills the calling thread's mask (pid 0)
    // into a set of the size passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(format!(
                "sched_getaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

/// Pinning is only implemented on Linux.
#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(_rank: usize) -> Result<usize, String> {
    Err("pinning threads is only supported on Linux".into())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_on_one_allowed_cpu() {
        let cpu = std::thread::spawn(|| {
            let cpu = pin_current_thread(5)?;
            assert_eq!(allowed_cpus()?, vec![cpu]);
            Ok::<usize, String>(cpu)
        })
        .join()
        .expect("the test thread finishes");
        assert!(cpu.is_ok(), "{cpu:?}");
    }
}
