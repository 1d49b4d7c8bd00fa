//! Helpers for the tests that run the real kvtui on a pseudo-terminal (util-linux `script`).

/// The children of `pid`, from `/proc/PID/task/*/children`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The pid of the kvtui process below `script` (pid `root`). `script -c` runs the command
/// through `$SHELL -c`, which may or may not exec it, so the kvtui process is looked for by
/// name among all descendants: signalling the shell instead would end `script` before kvtui
/// had written its restoring bytes.
pub fn kvtui_below(root: u32) -> Option<u32> {
    let mut todo = children_of(root);
    while let Some(pid) = todo.pop() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "kvtui" {
            return Some(pid);
        }
        todo.extend(children_of(pid));
    }
    None
}

/// kvtui on a pseudo-terminal (`script`), its screen output collected as it comes; killed
/// (kvtui by its pid, then script) when dropped.
pub struct Terminal {
    script: std::process::Child,
    /// kvtui's pid, below script.
    pub kvtui: u32,
    screen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Terminal {
    /// Runs `kvtui ARGS` on a 160x45 terminal, and waits until kvtui is running.
    pub fn start(args: &str) -> Terminal {
        use std::io::Read;
        // The pseudo-terminal starts at 0x0 when the test has no terminal: give it a size.
        let command = format!("stty cols 160 rows 45; exec {} {args}", env!("CARGO_BIN_EXE_kvtui"));
        let mut script = std::process::Command::new(kvtestkit::tools::program("script"))
            .args(["-qfec", &command, "/dev/null"])
            .env("TERM", "xterm")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut out = script.stdout.take().unwrap();
        let screen: std::sync::Arc<std::sync::Mutex<Vec<u8>>> = Default::default();
        let reader = std::thread::spawn({
            let screen = screen.clone();
            move || {
                let mut chunk = [0u8; 16 * 1024];
                while let Ok(n) = out.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    screen.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            }
        });
        let root = script.id();
        let kvtui = kvtestkit::until("kvtui to start under script", kvtestkit::HANG, || {
            kvtui_below(root).ok_or("not yet")
        });
        Terminal {
            script,
            kvtui,
            screen,
            reader: Some(reader),
        }
    }

    /// Waits until the screen output holds `bytes`.
    pub fn wait_for(&self, bytes: &[u8]) {
        kvtestkit::until(
            &format!("the screen to show {:?}", String::from_utf8_lossy(bytes)),
            kvtestkit::HANG,
            || {
                let screen = self.screen.lock().unwrap();
                match screen.windows(bytes.len()).any(|w| w == bytes) {
                    true => Ok(()),
                    false => Err(String::from_utf8_lossy(&screen[screen.len().saturating_sub(300)..]).into_owned()),
                }
            },
        )
    }

    /// Sends `signal` (`-TERM`, `-HUP`) to kvtui, waits for script to end, and returns
    /// everything the terminal showed.
    pub fn stop(mut self, signal: &str) -> Vec<u8> {
        let sent = std::process::Command::new("kill")
            .args([signal, &self.kvtui.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let script = &mut self.script;
        kvtestkit::until(&format!("kvtui to end after {signal}"), kvtestkit::HANG, || {
            script.try_wait().unwrap().ok_or("running")
        });
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        std::mem::take(&mut *self.screen.lock().unwrap())
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if self.script.try_wait().ok().flatten().is_none() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.kvtui.to_string()])
                .status();
            let _ = self.script.kill();
            let _ = self.script.wait();
        }
    }
}
