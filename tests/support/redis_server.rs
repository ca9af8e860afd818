//! A real `redis-server` for one test: on a free 127.0.0.1 port, nothing persisted, killed on Drop,
//! and able to be stopped, restarted on the same port, paused and have its script cache flushed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

/// How long a fresh server may take to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(10);
/// Deadline for one helper command (a paused server answers late, never this late in a test).
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A `redis-server` child process owned by a test.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers PING.
    pub fn start() -> RedisServer {
        let port = free_port();
        let mut server = RedisServer { port, child: None };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The server's port (kept across `restart`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server and waits for it to exit; its data is gone (nothing is persisted).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Already exited is fine: the goal is that it is not running.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server if it runs, then starts a fresh one on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Makes the server hold every client command for `duration` (`CLIENT PAUSE ms ALL`).
    pub fn pause(&self, duration: Duration) {
        let ms = duration.as_millis().to_string();
        let reply = self.command(&["CLIENT", "PAUSE", &ms, "ALL"]);
        assert_eq!(reply, "OK", "CLIENT PAUSE");
    }

    /// Empties the server's script cache (`SCRIPT FLUSH`).
    pub fn script_flush(&self) {
        assert_eq!(self.command(&["SCRIPT", "FLUSH"]), "OK", "SCRIPT FLUSH");
    }

    /// Sends one command on a new connection and returns the reply as text: a status or bulk string
    /// as is, an integer in decimal, nil as `(nil)`, an array as its items one per line. Panics on
    /// an error reply or when the server does not answer.
    pub fn command(&self, args: &[&str]) -> String {
        let mut stream = self.connect();
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes()).unwrap_or_else(|e| {
            panic!("redis-server on port {}: sending {args:?}: {e}", self.port)
        });
        let mut reader = BufReader::new(stream);
        match read_reply(&mut reader) {
            Ok(reply) => reply,
            Err(e) => panic!("redis-server on port {}: {args:?}: {e}", self.port),
        }
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))
            .unwrap_or_else(|e| panic!("redis-server on port {}: connecting: {e}", self.port));
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .expect("set read timeout");
        stream
            .set_write_timeout(Some(IO_TIMEOUT))
            .expect("set write timeout");
        stream
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let dir = std::env::temp_dir();
        let child = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}); the Redis tests need it on PATH \
                     (Debian: apt-get install redis-server)"
                )
            });
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let polls = READY_WITHIN.as_millis() / POLL.as_millis();
        for _ in 0..polls {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    panic!(
                        "redis-server on port {} exited at start ({status}); is the port taken?",
                        self.port
                    );
                }
            }
            if pong(self.port) {
                return;
            }
            sleep(POLL);
        }
        self.stop();
        panic!(
            "redis-server on port {} did not answer PING within {READY_WITHIN:?}",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port the OS had free a moment ago (bound, then released before use).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

/// Whether a server on `port` answers an inline PING with +PONG.
fn pong(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    if stream.set_read_timeout(Some(POLL * 10)).is_err() || stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

fn read_reply(reader: &mut impl BufRead) -> Result<String, String> {
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("reading reply: {e}"))?;
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at_checked(1).ok_or("connection closed")?;
    match kind {
        "+" | ":" => Ok(rest.to_string()),
        "-" => Err(format!("error reply: {rest}")),
        "$" => {
            let len: i64 = rest
                .parse()
                .map_err(|e| format!("bulk length {rest:?}: {e}"))?;
            if len < 0 {
                return Ok("(nil)".to_string());
            }
            let mut bytes = vec![0u8; len as usize + 2];
            reader
                .read_exact(&mut bytes)
                .map_err(|e| format!("reading bulk: {e}"))?;
            bytes.truncate(len as usize);
            String::from_utf8(bytes).map_err(|e| format!("bulk not UTF-8: {e}"))
        }
        "*" => {
            let n: i64 = rest
                .parse()
                .map_err(|e| format!("array length {rest:?}: {e}"))?;
            let items = (0..n.max(0))
                .map(|_| read_reply(reader))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(items.join("\n"))
        }
        other => Err(format!("unexpected reply type {other:?}: {line:?}")),
    }
}
