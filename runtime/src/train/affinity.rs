//! Gives every thread rank an equal share of the machine. Left to the OS, four rank threads on
//! two cores do not share them evenly: the scheduler may keep one rank alone on a core while
//! three share the other, so that rank runs a whole backward ahead and every collective waits
//! for the slowest. Pinning rank `r` to the `r mod n`-th CPU the process may use (as launchers
//! bind one process per GPU to its CPUs) keeps the ranks' progress even.

/// Pins the calling thread to the `width` CPUs of `rank` (CPUs `rank * width ..` of those the
/// process may use, wrapping around); threads it starts later inherit them. Returns the first.
#[cfg(target_os = "linux")]
pub fn pin_current_thread_to(rank: usize, width: usize) -> Result<usize, String> {
    let allowed = allowed_cpus()?;
    if allowed.is_empty() {
        return Err("the process may run on no CPU".into());
    }
    let width = width.clamp(1, allowed.len());
    let cpus: Vec<usize> = (0..width)
        .map(|i| allowed[(rank * width + i) % allowed.len()])
        .collect();
    // SAFETY: `cpu_set_t` is plain data; the call sets the calling thread's mask (pid 0)
    // from a set of the size passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in &cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!(
                "sched_setaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(cpus[0])
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
pub fn pin_current_thread_to(_rank: usize, _width: usize) -> Result<usize, String> {
    Err("pinning threads is only supported on Linux".into())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_on_one_allowed_cpu() {
        let cpu = std::thread::spawn(|| {
            let cpu = pin_current_thread_to(5, 1)?;
            assert_eq!(allowed_cpus()?, vec![cpu]);
            Ok::<usize, String>(cpu)
        })
        .join()
        .expect("the test thread finishes");
        assert!(cpu.is_ok(), "{cpu:?}");
    }

    #[test]
    fn a_rank_pinned_to_a_width_gets_that_many_cpus_and_its_threads_inherit_them() {
        let got = std::thread::spawn(|| {
            let before = allowed_cpus()?.len();
            pin_current_thread_to(1, 2)?;
            let mine = allowed_cpus()?;
            let child = std::thread::spawn(allowed_cpus)
                .join()
                .expect("the child thread finishes")?;
            Ok::<_, String>((before, mine, child))
        })
        .join()
        .expect("the test thread finishes");
        let (before, mine, child) = got.expect("pinning works here");
        assert_eq!(mine.len(), before.min(2));
        assert_eq!(child, mine);
    }
}
