//! The service under measurement, run as a child process of the benchmark or load program
//! (the same executable, started again with arguments), so that its memory and its disk
//! writes are its own.
//!
//! `SERVICE_WRAPPER=PROGRAM` starts the service under `PROGRAM` (for example
//! `heaptrack`, or `valgrind --tool=massif` through a script), to see where its memory or
//! its time goes under the same load.

use payhook::signature::{Algorithm, SigningKey, generate_key_pair};
use std::{
    ffi::OsString,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

/// A new key pair of `algorithm`: the public key written to `dir/public.pem` (for the
/// service), the private one to sign with (for the driver).
pub(crate) fn signing_key(dir: &Path, algorithm: Algorithm) -> (PathBuf, SigningKey) {
    let pair = generate_key_pair(algorithm).unwrap();
    let public_key = dir.join("public.pem");
    std::fs::write(&public_key, &pair.public_pem).unwrap();
    let key = SigningKey::from_pkcs8(pair.private_pem.as_bytes(), algorithm).unwrap();
    (public_key, key)
}

/// A running child service; killed when dropped.
pub(crate) struct Server {
    child: Child,
    /// Where it listens, as it printed it.
    pub(crate) address: SocketAddr,
}

impl Server {
    /// Runs this executable again with `args`, its standard error going to `stderr`, and
    /// waits for its `listening on ADDRESS` line.
    pub(crate) fn start(args: &[&str], stderr: Stdio) -> Self {
        let wrapper: Vec<OsString> = std::env::var_os("SERVICE_WRAPPER").into_iter().collect();
        Self::start_under(&wrapper, args, stderr)
    }

    /// As [`Server::start`], with the service run by the program and arguments `wrapper`
    /// (none: run directly), whatever `SERVICE_WRAPPER` says.
    pub(crate) fn start_under(wrapper: &[OsString], args: &[&str], stderr: Stdio) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut command = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut command = Command::new(program);
                command.args(wrapper_args).arg(&exe);
                command
            }
            None => Command::new(&exe),
        };
        let mut child = command
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let address = loop {
            let line = lines.next().unwrap().unwrap();
            if let Some(address) = line.strip_prefix("listening on ") {
                break address.parse().unwrap();
            }
        };
        Self { child, address }
    }

    /// Its process id (under a wrapper that runs it in-process, as valgrind does, the
    /// wrapper's).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident set size now (`VmRSS`) and at its peak (`VmHWM`), MiB.
    pub(crate) fn rss_mib(&self) -> (f64, f64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .map_or(f64::NAN, |kib| kib / 1024.0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// CPU time it used so far, user and system, all threads (`/proc/PID/stat`), seconds.
    pub(crate) fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of(&self.child.id().to_string())
    }

    /// Bytes it caused to be written to storage so far (`/proc/PID/io`).
    pub(crate) fn written_bytes(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/io", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("write_bytes:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time the process `pid` (or `self`) used so far, user and system, all threads
/// (`/proc/PID/stat`), seconds; 0 where there is no `/proc` (not Linux).
pub(crate) fn cpu_seconds_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's name, which is in parentheses and may hold spaces:
    // utime and stime are the 14th and 15th fields of the line, in clock ticks.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: f64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<f64>().ok())
        .sum();
    // Clock ticks are USER_HZ, which Linux fixes at 100 for user space on x86.
    ticks / 100.0
}
