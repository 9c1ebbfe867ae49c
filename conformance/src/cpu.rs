//! CPU time, for benchmarks that compare client CPU per operation (Linux
//! `/proc`; zero elsewhere).

/// CPU nanoseconds used so far by every live thread of this process
/// (`/proc/self/task/*/schedstat`).
pub fn self_cpu_ns() -> u64 {
    let mut total = 0;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            total += stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

/// `(parent pid, utime + stime in ns)` of process `pid` (10 ms ticks).
fn stat_of(pid: &str) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let num = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // After the command: state 0, ppid 1, utime 11, stime 12.
    Some((
        u32::try_from(num(1)).ok()?,
        (num(11) + num(12)) * 10_000_000,
    ))
}

/// CPU nanoseconds used so far by process `pid` and its live children (a
/// server such as PostgreSQL forks a process per connection); 0 for
/// `None` or a process that is gone.
pub fn process_tree_cpu_ns(pid: Option<u32>) -> u64 {
    let Some(pid) = pid else { return 0 };
    let mut total = stat_of(&pid.to_string()).map_or(0, |s| s.1);
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for p in procs.flatten() {
            let name = p.file_name();
            let name = name.to_string_lossy();
            if name.bytes().all(|b| b.is_ascii_digit())
                && let Some((ppid, ns)) = stat_of(&name)
                && ppid == pid
            {
                total += ns;
            }
        }
    }
    total
}

/// The median of `values` (the upper one of an even count; 0 when empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_cpu() {
        let before = self_cpu_ns();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(self_cpu_ns() > before);
        assert_eq!(process_tree_cpu_ns(None), 0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
