//! How much memory this process can still get, so that a model too large for the machine is
//! refused with a message before any of it is allocated: a failed allocation aborts the whole
//! process, and an overcommitted one gets it killed later.

/// Bytes the kernel says can be allocated without swapping (`MemAvailable`), lowered to what
/// the cgroup (a container's memory limit) still allows. `None` where neither is known.
pub fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| mem_available(&s));
    let cgroup = cgroup_headroom(
        std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok(),
        std::fs::read_to_string("/sys/fs/cgroup/memory.current").ok(),
    );
    meminfo.into_iter().chain(cgroup).min()
}

/// Refuses `what` when the `bytes` it needs (`None`: more than a u64 counts) exceed what
/// [`available_bytes`] says this process can still get. Unknown availability passes.
pub fn check_fits(what: &str, bytes: Option<u64>) -> Result<(), String> {
    let Some(bytes) = bytes else {
        return Err(format!(
            "{what} does not fit in memory: it needs more than {} bytes",
            u64::MAX
        ));
    };
    match available_bytes() {
        Some(avail) if bytes > avail => Err(format!(
            "{what} does not fit in memory: it needs at least {}, and {} is available",
            gib(bytes),
            gib(avail)
        )),
        _ => Ok(()),
    }
}

/// `MemAvailable:   24078836 kB` → bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// cgroup v2: `memory.max` (a number or `max`) minus `memory.current`.
fn cgroup_headroom(max: Option<String>, current: Option<String>) -> Option<u64> {
    let max: u64 = max?.trim().parse().ok()?; // `max`: no limit
    let current: u64 = current?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// Bytes as GiB with two decimals, for messages.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available_and_the_cgroup_limit() {
        let info = "MemTotal:       24528012 kB\nMemFree:  100 kB\nMemAvailable:   24078836 kB\n";
        assert_eq!(mem_available(info), Some(24_078_836 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(
            cgroup_headroom(Some("1000\n".into()), Some("300\n".into())),
            Some(700)
        );
        assert_eq!(
            cgroup_headroom(Some("max\n".into()), Some("300\n".into())),
            None
        );
        assert_eq!(cgroup_headroom(None, Some("300".into())), None);
    }

    #[test]
    fn sizes_past_memory_or_past_counting_are_refused() {
        let e = check_fits("x", None).expect_err("uncountable");
        assert!(e.contains("x does not fit in memory"), "{e}");
        if available_bytes().is_some() {
            let e = check_fits("y", Some(u64::MAX)).expect_err("too large");
            assert!(
                e.contains("y does not fit in memory: it needs at least"),
                "{e}"
            );
        }
        assert!(check_fits("z", Some(1)).is_ok());
    }

    #[test]
    fn this_machine_reports_some_memory() {
        // Linux CI and dev machines have /proc/meminfo
        if cfg!(target_os = "linux") {
            assert!(available_bytes().is_some_and(|b| b > 0));
        }
    }
}
