//! A stand-in Pyroscope for the cluster test: an HTTP listener on the node's own address
//! (which pods reach through their gateway) that answers every request 200 and keeps each
//! request's line and `Authorization` header, so the test can see which token the agent
//! sent: the one in the Secret the chart mounted, read through `bearer_token_file`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One request: its request line and its Authorization header ("" when absent).
pub type Seen = (String, String);

pub struct Receiver {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Listens on `ip`, port chosen by the kernel.
    pub fn start(ip: &str) -> Self {
        let listener = TcpListener::bind((ip, 0)).expect("binding the receiver");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("local addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        if let Some(r) = serve(conn) {
                            s.lock().expect("seen").push(r);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        Receiver {
            port,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits until a request matches `f`; returns it, or panics after `limit` with what came.
    pub fn until(&self, limit: Duration, f: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(r) = self.seen.lock().expect("seen").iter().find(|r| f(r)) {
                return r.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no matching request within {limit:?}; requests: {:?}",
                self.seen.lock().expect("seen")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request (headers, then a Content-Length body), answers 200 and closes.
fn serve(conn: TcpStream) -> Option<Seen> {
    conn.set_nonblocking(false).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let request = line.trim_end().to_owned();
    let (mut auth, mut length) = (String::new(), 0usize);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h.trim_end().is_empty() {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            match k.to_ascii_lowercase().as_str() {
                "authorization" => auth = v.trim().to_owned(),
                "content-length" => length = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    let mut body = vec![0u8; length.min(64 << 20)];
    let _ = reader.read_exact(&mut body);
    let mut w = conn;
    let _ = w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/proto\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    Some((request, auth))
}
