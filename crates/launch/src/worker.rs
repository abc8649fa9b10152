//! One worker process: started with its rank's environment in a process group of its own,
//! its output copied line by line with a `[rank N]` prefix, its last lines kept for the
//! error message, signalled and reaped. Under the `mpi` engine the one "worker" is the
//! attempt's `mpirun` job, whose ranks are its children.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use afterburner_rendezvous::Launched;

use crate::LaunchError;

/// How many of a worker's last output lines an error shows.
const TAIL_LINES: usize = 12;

/// A running worker.
pub(crate) struct Worker {
    /// Its global rank.
    pub rank: usize,
    child: Child,
    pumps: Vec<JoinHandle<()>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Its exit status, once reaped.
    pub status: Option<ExitStatus>,
    /// Whether it is an `mpirun` job (its ranks are its children, each in its own group).
    job: bool,
}

impl Worker {
    /// Starts `program` as the worker `launched` describes.
    pub fn start(program: &[OsString], launched: &Launched) -> Result<Self, LaunchError> {
        let (name, args) = program
            .split_first()
            .ok_or_else(|| LaunchError::Usage("no PROGRAM to launch".into()))?;
        let mut command = Command::new(name);
        command.args(args).envs(launched.to_vars());
        let prefix = Some(format!("[rank {}] ", launched.rank));
        Self::spawn(command, &name.to_string_lossy(), launched.rank, prefix)
    }

    /// Starts an attempt's `mpirun` job (`command`, from the `mpi_job` module): its ranks'
    /// tagged lines are printed as the workers' (`[rank N] ...`).
    pub fn start_job(command: Command) -> Result<Self, LaunchError> {
        Self::spawn(command, "mpirun", 0, None)
    }

    /// Whether it is an attempt's `mpirun` job.
    pub fn is_job(&self) -> bool {
        self.job
    }

    /// What messages call it: `rank N`, or `the mpirun job`.
    pub fn name(&self) -> String {
        match self.job {
            true => "the mpirun job".into(),
            false => format!("rank {}", self.rank),
        }
    }

    /// Starts `command` as rank `rank` (`prefix` for its lines; `None`: an `mpirun` job,
    /// whose lines carry mpirun's tags).
    fn spawn(
        mut command: Command,
        name: &str,
        rank: usize,
        prefix: Option<String>,
    ) -> Result<Self, LaunchError> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a terminal's Ctrl-C reaches the launcher only, which
            // forwards it, and a stop reaches the worker's own children too.
            .process_group(0);
        let mut child = command.spawn().map_err(|e| LaunchError::Program {
            program: name.to_string(),
            reason: match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "no such program (not a path to a file, not on PATH)".into()
                }
                std::io::ErrorKind::PermissionDenied => "not executable".into(),
                _ => e.to_string(),
            },
        })?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let job = prefix.is_none();
        let mut pumps = Vec::new();
        if let Some(out) = child.stdout.take() {
            pumps.push(pump(out, prefix.clone(), None, false));
        }
        if let Some(err) = child.stderr.take() {
            pumps.push(pump(err, prefix, Some(tail.clone()), true));
        }
        Ok(Self {
            rank,
            child,
            pumps,
            tail,
            status: None,
            job,
        })
    }

    /// Its exit status if it has exited (reaped once, then remembered).
    pub fn poll(&mut self) -> Result<Option<ExitStatus>, LaunchError> {
        if self.status.is_none() {
            self.status = self
                .child
                .try_wait()
                .map_err(|e| LaunchError::Os(format!("watching rank {}: {e}", self.rank)))?;
        }
        Ok(self.status)
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        !matches!(self.poll(), Ok(Some(_)))
    }

    /// Sends `signal` to its process group (it and its children). To an `mpirun` job: to
    /// its ranks (each in a group of its own), so they stop (and save) as workers do; a
    /// SIGKILL reaches `mpirun` too.
    pub fn signal(&self, signal: i32) {
        if self.status.is_some() {
            return;
        }
        let mut groups = match self.job {
            true => children(self.child.id()),
            false => Vec::new(),
        };
        if !self.job || signal == libc::SIGKILL {
            groups.push(self.child.id());
        }
        for group in groups {
            // SAFETY: kill(2) with a negative pid signals that process group; no memory is
            // shared. A group that is already gone answers ESRCH, which is fine.
            unsafe {
                libc::kill(-(group as i32), signal);
            }
        }
    }

    /// Its last lines of error output.
    pub fn last_output(&self) -> Vec<String> {
        self.tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// Waits (until `deadline`) for its output to be copied out: a child of the worker that
    /// still holds its output open is not waited for past it.
    pub fn flush_output(&mut self, deadline: Instant) {
        while self.pumps.iter().any(|p| !p.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for pump in self.pumps.extract_if(.., |p| p.is_finished()) {
            let _ = pump.join();
        }
    }
}

impl Drop for Worker {
    /// Never a stray process: a worker still running when the launcher lets go is killed.
    fn drop(&mut self) {
        if self.running() {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// The pids of `parent`'s children (Linux's `/proc`; empty where it cannot be read).
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`: the parent follows the last `)`.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after.split_whitespace().nth(1) == Some(parent.to_string().as_str())
        })
        .collect()
}

/// What an exit status says, for messages: "exited with code 3", "was killed by signal 9".
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal} ({})", signal_name(signal)),
        _ => "exited".into(),
    }
}

/// The exit code a shell would show for `status` (128 + the signal for a killed process).
pub(crate) fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        _ => 1,
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGFPE => "SIGFPE",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

/// Copies `from` line by line to the launcher's stdout (or stderr), each line prefixed (`None`:
/// `mpirun`'s rank tags rewritten as the launcher's); keeps the last lines in `tail`.
fn pump(
    from: impl Read + Send + 'static,
    prefix: Option<String>,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
    to_stderr: bool,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            let written = match &prefix {
                Some(prefix) => format!("{prefix}{text}\n"),
                None => format!("{}\n", crate::mpi_job::retag(text)),
            };
            let _ = match to_stderr {
                true => std::io::stderr().lock().write_all(written.as_bytes()),
                false => std::io::stdout().lock().write_all(written.as_bytes()),
            };
            if let Some(tail) = &tail {
                let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(match &prefix {
                    Some(_) => text.to_string(),
                    None => crate::mpi_job::retag(text),
                });
            }
        }
    })
}
