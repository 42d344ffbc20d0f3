//! Pinning the thread pool's workers to cores (`--pin-threads`, `AIM_PIN_THREADS=cores`):
//! each worker bound to one logical CPU of its own, one per physical core before any
//! core's second hardware thread, as Anakin's and ONNX Runtime's thread-affinity
//! options do. Off by default: on a machine shared with other work the scheduler's
//! freedom to move a thread off a busy core is usually worth more than cache locality.

/// The logical CPUs this process may run on, in the order workers take them: the first
/// hardware thread of every physical core (by package and core id), then the others.
/// Linux only; elsewhere an error saying so.
pub fn pin_order() -> std::io::Result<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        let allowed = allowed_cpus()?;
        let topology = |cpu: usize, f: &str| {
            std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{f}"))
                .ok()
                .map(|s| s.trim().to_string())
        };
        let mut seen = std::collections::BTreeSet::new();
        let (mut first, mut rest) = (Vec::new(), Vec::new());
        for cpu in allowed {
            let core = (topology(cpu, "physical_package_id"), topology(cpu, "core_id"));
            // Unknown topology: every CPU counts as a core of its own.
            if core.1.is_none() || seen.insert(core) {
                first.push(cpu);
            } else {
                rest.push(cpu);
            }
        }
        first.extend(rest);
        Ok(first)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "pinning threads is implemented on Linux only"))
    }
}

/// The CPUs in this process's affinity mask.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most
    // its size into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// Binds the calling thread to logical CPU `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no CPU {cpu}")));
        }
        // SAFETY: as in `allowed_cpus`; `cpu` is within the set's size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "pinning threads is implemented on Linux only"))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn the_order_covers_the_allowed_cpus_once() {
        let order = pin_order().unwrap();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, allowed_cpus().unwrap());
        // A thread pinned to the first one runs there.
        std::thread::spawn(move || {
            pin_current_thread(order[0]).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![order[0]]);
        })
        .join()
        .unwrap();
    }
}
