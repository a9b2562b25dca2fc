//! A process's resident memory and CPU time, from `/proc`.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};

/// Clock ticks per second of `/proc/PID/stat` (`getconf CLK_TCK`; 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

fn proc_file(pid: u32, name: &str) -> PathBuf {
    PathBuf::from("/proc").join(pid.to_string()).join(name)
}

/// Resident memory (`VmRSS`) in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(proc_file(pid, "status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))?;
    let kib: u64 = line.split_whitespace().nth(1).unwrap_or("0").parse()?;
    Ok(kib * 1024)
}

/// User plus system CPU time in seconds (`utime` + `stime` of `/proc/PID/stat`).
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(proc_file(pid, "stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces; fields after its `)` are plain.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("malformed /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after `)`.
    let ticks = |i: usize| -> Result<f64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| anyhow!("short /proc/{pid}/stat"))?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / TICKS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).unwrap() > 0);
        let busy = std::time::Instant::now();
        let mut x = 0u64;
        while busy.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(cpu_seconds(pid).unwrap() >= 0.0);
    }
}
