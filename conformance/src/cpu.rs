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

/// Every thread of this process and of the processes it started (the
/// servers of a `--spawn` run, and theirs: PostgreSQL's per-connection
/// backends) pinned to one CPU, the one the calling thread runs on, until
/// dropped; each thread's affinity is then put back (threads started
/// meanwhile get this process's first thread's).
///
/// For latency pairs on a machine with few CPUs: every cycle is a chain of
/// hand-offs (caller, an embedded database's connection thread, a server
/// process and its threads), and which CPU the OS gives each side decides
/// the whole run's latency level, for ours and the floor apart (a wake-up
/// on an idle other CPU costs far more than one on the same CPU; here the
/// same binary measured PostgreSQL's ratio 1.16 and 0.50 in two runs). On
/// one CPU both pay the same hand-offs, and the ratio says what the code
/// costs. One client's cycle is a strict ping-pong, so nothing waits for
/// the CPU that would have run elsewhere.
///
/// Linux only; elsewhere (or if no affinity can be set) `pin` returns
/// `None` and nothing changes.
pub struct OneCpu {
    /// The CPU everything runs on.
    pub cpu: usize,
    #[cfg(target_os = "linux")]
    saved: Vec<(libc::pid_t, libc::cpu_set_t)>,
}

impl OneCpu {
    /// Pins every thread of this process and of its descendants to the CPU
    /// the caller runs on.
    #[cfg(target_os = "linux")]
    pub fn pin() -> Option<Self> {
        Self::pin_where(|_, _| true)
    }

    /// Pins nothing: not Linux.
    #[cfg(not(target_os = "linux"))]
    pub fn pin() -> Option<Self> {
        None
    }

    /// Like [`pin`](Self::pin) for the pair under test only: this process
    /// and the servers listening on loopback `ports` (with their
    /// descendants) go to the calling thread's CPU, and every other
    /// process this one started (the other backends' servers of a
    /// `--spawn` run) to the remaining CPUs, so that their background work
    /// (a JVM's compiler and collector, a raft tick) does not run inside
    /// the measured pair. With no other CPU they are left where they are.
    #[cfg(target_os = "linux")]
    pub fn pin_serving(ports: &[u16]) -> Option<Self> {
        Self::pin_where(|family, pid| {
            pid == std::process::id() || serving_tree(family, ports).contains(&pid)
        })
    }

    /// Pins the processes of this one's family (with their threads) for
    /// which `measured(family, pid)` holds to the calling thread's CPU, and
    /// the others to the remaining CPUs (left alone with no other CPU).
    #[cfg(target_os = "linux")]
    fn pin_where(measured: impl Fn(&[(u32, u32)], u32) -> bool) -> Option<Self> {
        // SAFETY: no arguments; returns the CPU number or -1.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).ok()?;
        // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` comes from the kernel, so it is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut one) };
        let mut rest = affinity_of(0)?;
        // SAFETY: as above.
        unsafe { libc::CPU_CLR(cpu, &mut rest) };
        // SAFETY: a live cpu_set_t.
        let others_move = unsafe { libc::CPU_COUNT(&rest) } > 0;
        let family = family_processes();
        let mut saved = Vec::new();
        for (pid, _) in &family {
            let mask = if measured(&family, *pid) {
                &one
            } else if others_move {
                &rest
            } else {
                continue;
            };
            for tid in threads_of(*pid) {
                if let Some(before) = affinity_of(tid)
                    && set_affinity(tid, mask)
                {
                    saved.push((tid, before));
                }
            }
        }
        (!saved.is_empty()).then_some(Self { cpu, saved })
    }

    /// Pins nothing: not Linux.
    #[cfg(not(target_os = "linux"))]
    pub fn pin_serving(_ports: &[u16]) -> Option<Self> {
        None
    }
}

/// The processes of `family` (`(pid, parent)`) listening on loopback TCP
/// `ports`, and their descendants.
#[cfg(target_os = "linux")]
fn serving_tree(family: &[(u32, u32)], ports: &[u16]) -> Vec<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address (addr:PORT in hex), st (0A: listening), inode.
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if *state == "0A" && port.is_some_and(|p| ports.contains(&p)) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    let mut tree: Vec<u32> = family
        .iter()
        .map(|(pid, _)| *pid)
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|to| inodes.iter().any(|i| to.as_os_str() == i.as_str()))
                })
            })
        })
        .collect();
    with_descendants(&mut tree, family);
    tree
}

/// Adds to `tree` every descendant, in `processes` (`(pid, parent)`), of
/// the processes already in it (breadth first).
#[cfg(target_os = "linux")]
fn with_descendants(tree: &mut Vec<u32>, processes: &[(u32, u32)]) {
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            processes
                .iter()
                .filter(|(pid, ppid)| *ppid == parent && *pid != parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
}

#[cfg(target_os = "linux")]
impl Drop for OneCpu {
    fn drop(&mut self) {
        let Some(&(_, first)) = self.saved.first() else {
            return;
        };
        for tid in family_threads() {
            let mask = self
                .saved
                .iter()
                .find(|(saved, _)| *saved == tid)
                .map_or(first, |(_, mask)| *mask);
            set_affinity(tid, &mask);
        }
    }
}

/// The thread ids of this process (its own first) and of every process
/// descended from it.
#[cfg(target_os = "linux")]
fn family_threads() -> Vec<libc::pid_t> {
    family_processes()
        .iter()
        .flat_map(|(pid, _)| threads_of(*pid))
        .collect()
}

/// This process (first) and every process descended from it, each with
/// its parent.
#[cfg(target_os = "linux")]
fn family_processes() -> Vec<(u32, u32)> {
    let me = std::process::id();
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|procs| {
            procs
                .flatten()
                .filter_map(|p| {
                    let pid: u32 = p.file_name().to_str()?.parse().ok()?;
                    Some((pid, stat_of(&pid.to_string())?.0))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut pids = vec![me];
    with_descendants(&mut pids, &parents);
    pids.into_iter()
        .map(|pid| {
            let parent = if pid == me {
                0
            } else {
                parents
                    .iter()
                    .find(|(p, _)| *p == pid)
                    .map_or(0, |(_, pp)| *pp)
            };
            (pid, parent)
        })
        .collect()
}

/// The thread ids of process `pid` (none once it is gone).
#[cfg(target_os = "linux")]
fn threads_of(pid: u32) -> Vec<libc::pid_t> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(target_os = "linux")]
fn affinity_of(tid: libc::pid_t) -> Option<libc::cpu_set_t> {
    // SAFETY: all zeroes is a valid (empty) set, filled by the kernel.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `mask` is a live cpu_set_t of `size` bytes.
    (unsafe { libc::sched_getaffinity(tid, size, &mut mask) } == 0).then_some(mask)
}

#[cfg(target_os = "linux")]
fn set_affinity(tid: libc::pid_t, mask: &libc::cpu_set_t) -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `mask` is a live cpu_set_t of `size` bytes; a thread that
    // ended meanwhile only makes the call fail.
    unsafe { libc::sched_setaffinity(tid, size, mask) == 0 }
}

/// The median of `values` (the upper one of an even count; 0 when empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pinning tests change every thread of this process: one at a time.
    static PINNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn pinning() -> std::sync::MutexGuard<'static, ()> {
        PINNING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn one_cpu_pins_every_thread_and_puts_them_back() {
        let _one = pinning();
        let before = affinity_of(0).expect("own affinity");
        let (started, go) = std::sync::mpsc::channel::<()>();
        let (done, finish) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            started.send(()).unwrap();
            finish.recv().unwrap();
            // SAFETY: no arguments.
            let tid = unsafe { libc::gettid() };
            affinity_of(tid).expect("thread affinity")
        });
        go.recv().unwrap();
        let pinned = OneCpu::pin().expect("pinned");
        let count = |mask: &libc::cpu_set_t| {
            // SAFETY: a live cpu_set_t.
            unsafe { libc::CPU_COUNT(mask) }
        };
        assert_eq!(count(&affinity_of(0).unwrap()), 1);
        // SAFETY: a live cpu_set_t; the pinned CPU is set.
        assert!(unsafe { libc::CPU_ISSET(pinned.cpu, &affinity_of(0).unwrap()) });
        drop(pinned);
        done.send(()).unwrap();
        let theirs = other.join().unwrap();
        assert_eq!(count(&affinity_of(0).unwrap()), count(&before));
        assert_eq!(count(&theirs), count(&before));
        // A child process is pinned too, and put back.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        let pinned = OneCpu::pin().expect("pinned");
        assert_eq!(count(&affinity_of(pid).unwrap()), 1);
        drop(pinned);
        assert_eq!(count(&affinity_of(pid).unwrap()), count(&before));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The server on the given port goes to the pinned CPU with this
    /// process; another child process goes to the other CPUs; all are put
    /// back.
    #[cfg(target_os = "linux")]
    #[test]
    fn pin_serving_separates_the_measured_server_from_the_others() {
        use std::io::BufRead;
        let _one = pinning();
        let count = |mask: &libc::cpu_set_t| {
            // SAFETY: a live cpu_set_t.
            unsafe { libc::CPU_COUNT(mask) }
        };
        let before = affinity_of(0).expect("own affinity");
        let mut server = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\n\
                 print(s.getsockname()[1],flush=True)\ntime.sleep(30)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 (Debian package python3)");
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line.trim().parse().unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = |c: &std::process::Child| libc::pid_t::try_from(c.id()).unwrap();
        let pinned = OneCpu::pin_serving(&[port]).expect("pinned");
        let on_cpu = |mask: &libc::cpu_set_t| {
            // SAFETY: a live cpu_set_t; the CPU number is below CPU_SETSIZE.
            unsafe { libc::CPU_ISSET(pinned.cpu, mask) }
        };
        for tid in [0, pid(&server)] {
            let mask = affinity_of(tid).unwrap();
            assert_eq!(count(&mask), 1, "{tid}");
            assert!(on_cpu(&mask), "{tid}");
        }
        let theirs = affinity_of(pid(&other)).unwrap();
        if count(&before) > 1 {
            assert_eq!(count(&theirs), count(&before) - 1);
            assert!(!on_cpu(&theirs));
        }
        drop(pinned);
        for tid in [0, pid(&server), pid(&other)] {
            assert_eq!(count(&affinity_of(tid).unwrap()), count(&before), "{tid}");
        }
        for child in [&mut server, &mut other] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

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
