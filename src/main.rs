//! The `holdfast` daemon: parse flags, raise the file limit, start the threads, print one line per
//! listener, wait for SIGINT or SIGTERM, stop cleanly.

use std::io::Write;
use std::process::ExitCode;

use holdfast::config::{self, Command};
use holdfast::server::Server;

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "cluster") {
        return cluster_command(std::env::args().skip(2).collect());
    }
    let config = match config::parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(c)) => c,
        Ok(Command::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("holdfast {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("holdfast: {e} (try --help)");
            return ExitCode::from(2);
        }
    };
    holdfast::log::set_level(config.log_level);
    if let Some(cluster) = &config.cluster {
        holdfast::log::set_node(u64::from(cluster.node_id));
    }
    // Block the stop signals and SIGHUP (reload) in every thread (threads inherit the mask), from
    // here on: this thread waits for them with sigwait, so no handler runs in the middle of
    // anything, and a SIGHUP while the secrets load (a log rotation during a restart) cannot end
    // the process by its default action.
    let signals = stop_signals();
    // SAFETY: `signals` is an initialised sigset; pthread_sigmask only changes this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };
    // Certificates, keys and tokens: a file that cannot be used (missing, malformed, readable by
    // other users) is a bad flag, refused with its one line before anything else is said.
    let secrets = match holdfast::tls::SecretStore::load(
        config.secrets.clone(),
        config.dlock_token.clone(),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfast: {e}");
            return ExitCode::from(2);
        }
    };
    holdfast::log_info!("starting {}", settings(&config));
    // As memcached does: --max-connections must not be cut short by a low default soft limit.
    holdfast::fdlimit::raise_to_hard();

    let server = match Server::start_with(config, secrets, holdfast::admin::start) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfast: {e}");
            let bad_flag = e
                .get_ref()
                .is_some_and(|e| e.downcast_ref::<config::BadFlag>().is_some());
            return if bad_flag {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            };
        }
    };
    {
        let mut stdout = std::io::stdout().lock();
        for (proto, addr) in &server.addresses {
            let _ = writeln!(stdout, "holdfast: {} listening on {addr}", proto.name());
        }
        // After the lock listeners: launchers that read a fixed number of lines still work.
        if let Some(addr) = server.admin {
            let _ = writeln!(stdout, "holdfast: admin listening on {addr}");
        }
        let _ = stdout.flush();
    }
    holdfast::server::notify::ready();
    let mut signal = 0;
    loop {
        // SAFETY: both pointers are valid for the duration of the call.
        unsafe { libc::sigwait(&signals, &mut signal) };
        if signal != libc::SIGHUP {
            break;
        }
        server.reload();
    }
    holdfast::log_info!("signal {signal}: shutting down");
    holdfast::server::notify::stopping();
    server.stop();
    holdfast::log_info!("stopped");
    ExitCode::SUCCESS
}

/// The effective settings, for the start line.
fn settings(c: &config::Config) -> String {
    let addr = |a: Option<std::net::SocketAddr>| a.map_or("off".to_string(), |a| a.to_string());
    format!(
        "holdfast {} memcache={} lockd={} dlock={} admin={} threads={} memory={}MiB \
         max-item-size={} max-connections={} orphan-timeout={}ms dlock-idle-timeout={}ms \
         dlock-max-keys={} dlock-max-message={} dlock-token={} client-stall-timeout={}ms \
         compat={} log-level={}",
        env!("CARGO_PKG_VERSION"),
        addr(c.memcache),
        addr(c.lockd),
        addr(c.dlock),
        addr(c.admin),
        c.threads,
        c.memory_limit >> 20,
        c.max_item_size,
        c.max_connections,
        c.orphan_timeout_ms,
        c.dlock_idle_timeout_ms,
        c.dlock_max_keys,
        c.dlock_max_message,
        if c.dlock_token.is_some() || c.secrets.dlock_token.is_some() {
            "set"
        } else {
            "none"
        },
        c.client_stall_timeout_ms,
        match c.compat {
            config::Compat::Memcached => "memcached",
            config::Compat::Yrmcds => "yrmcds",
        },
        c.log_level.name(),
    )
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before sigaddset uses it.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// `holdfast cluster status|add ID=HOST:PORT|remove ID [--admin ADDR] [--admin-token-file FILE]
/// [--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]`: a node's view of its cluster, or a
/// membership change, through that node's admin port (HTTPS with `--tls`; the token from the
/// file or from `HOLDFAST_ADMIN_TOKEN`).
fn cluster_command(args: Vec<String>) -> ExitCode {
    let usage = "usage: holdfast cluster status|add ID=HOST:PORT|remove ID [--admin HOST:PORT] \
                 [--admin-token-file FILE] [--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] \
                 (the token may also come from HOLDFAST_ADMIN_TOKEN)";
    let mut admin = "127.0.0.1:2629".to_string();
    let mut token_file = None;
    let (mut tls, mut tls_ca, mut tls_cert, mut tls_key) = (false, None, None, None);
    let mut words = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let slot = match a.as_str() {
            "--admin" => None,
            "--admin-token-file" => Some(&mut token_file),
            "--tls-ca" => Some(&mut tls_ca),
            "--tls-cert" => Some(&mut tls_cert),
            "--tls-key" => Some(&mut tls_key),
            "--tls" => {
                tls = true;
                continue;
            }
            _ => {
                words.push(a);
                continue;
            }
        };
        let Some(v) = it.next() else {
            eprintln!("{usage}");
            return ExitCode::from(2);
        };
        match slot {
            Some(slot) => *slot = Some(std::path::PathBuf::from(v)),
            None => admin = v,
        }
    }
    let client = match AdminClient::new(admin, token_file, tls, tls_ca, tls_cert, tls_key) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast cluster: {e}");
            return ExitCode::from(2);
        }
    };
    let admin = client.addr.clone();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["status"] => match client.http("GET", "/cluster") {
            Ok((200, body)) => {
                print!("{body}");
                ExitCode::SUCCESS
            }
            Ok((code, body)) => {
                eprintln!(
                    "holdfast cluster status: {admin} answered {code}: {}",
                    body.trim()
                );
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("holdfast cluster status: {admin}: {e}");
                ExitCode::FAILURE
            }
        },
        ["add", member] => match config::parse_peers(member) {
            Ok(p) if p.len() == 1 => {
                let (id, addr) = p.into_iter().next().expect("one");
                member_change(
                    &client,
                    &format!("/cluster/add?id={id}&addr={addr}"),
                    id,
                    true,
                )
            }
            Ok(_) => {
                eprintln!("holdfast cluster add: one ID=HOST:PORT");
                ExitCode::from(2)
            }
            Err(e) => {
                eprintln!("holdfast cluster add: {e}");
                ExitCode::from(2)
            }
        },
        ["remove", id] => match id.parse::<u16>() {
            Ok(id) if id > 0 => {
                let id = u64::from(id);
                member_change(&client, &format!("/cluster/remove?id={id}"), id, false)
            }
            _ => {
                eprintln!("holdfast cluster remove: ID is a node id, 1 to 65535");
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!("{usage}");
            ExitCode::from(2)
        }
    }
}

/// How long `cluster add|remove` waits for the change to be applied (both steps of joint
/// consensus) before it says so.
const MEMBER_CHANGE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Propose a membership change, then watch `/cluster` until node `id` is (`added`) or is not a
/// voter and the joint configuration has been left.
fn member_change(client: &AdminClient, path: &str, id: u64, added: bool) -> ExitCode {
    let what = if added { "add" } else { "remove" };
    let admin = &client.addr;
    match client.http("POST", path) {
        Ok((202, body)) => eprint!("holdfast cluster {what}: {body}"),
        Ok((code, body)) => {
            eprintln!(
                "holdfast cluster {what}: {admin} answered {code}: {}",
                body.trim()
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("holdfast cluster {what}: {admin}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let deadline = std::time::Instant::now() + MEMBER_CHANGE_WAIT;
    loop {
        if let Ok((200, body)) = client.http("GET", "/cluster") {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) {
                let ids = |k: &str| -> Vec<u64> {
                    v[k].as_array()
                        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
                        .unwrap_or_default()
                };
                let done =
                    ids("voters").contains(&id) == added && ids("voters_outgoing").is_empty();
                if done {
                    print!("{body}");
                    return ExitCode::SUCCESS;
                }
            }
        }
        if std::time::Instant::now() >= deadline {
            eprintln!(
                "holdfast cluster {what}: not applied within {} s (a quorum lost, or another \
                 change under way?): see holdfast cluster status",
                MEMBER_CHANGE_WAIT.as_secs()
            );
            return ExitCode::FAILURE;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// How `holdfast cluster` reaches a node's admin port: its address, the token, TLS.
struct AdminClient {
    addr: String,
    token: Option<std::sync::Arc<[u8]>>,
    tls: Option<(
        std::sync::Arc<holdfast::tls::rustls::ClientConfig>,
        holdfast::tls::rustls::pki_types::ServerName<'static>,
    )>,
}

impl AdminClient {
    fn new(
        addr: String,
        token_file: Option<std::path::PathBuf>,
        tls: bool,
        ca: Option<std::path::PathBuf>,
        cert: Option<std::path::PathBuf>,
        key: Option<std::path::PathBuf>,
    ) -> Result<AdminClient, String> {
        let token = match token_file {
            Some(path) => Some(holdfast::tls::read_token(&path)?),
            None => std::env::var_os("HOLDFAST_ADMIN_TOKEN")
                .filter(|t| !t.is_empty())
                .map(|t| {
                    std::sync::Arc::from(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str()))
                }),
        };
        let tls =
            match holdfast::tls::client_flags(tls, ca.as_deref(), cert.as_deref(), key.as_deref())?
            {
                Some(config) => Some((config, holdfast::tls::server_name(host_of(&addr))?)),
                None => None,
            };
        Ok(AdminClient { addr, token, tls })
    }

    /// A GET or POST (no body) of `path` (HTTP/1.1, Connection: close), with deadlines.
    fn http(&self, method: &str, path: &str) -> Result<(u16, String), String> {
        use std::net::ToSocketAddrs;
        let deadline = std::time::Duration::from_secs(5);
        let sa = self
            .addr
            .to_socket_addrs()
            .map_err(|e| e.to_string())?
            .next()
            .ok_or("no address")?;
        let tcp = std::net::TcpStream::connect_timeout(&sa, deadline).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(deadline))
            .map_err(|e| e.to_string())?;
        tcp.set_write_timeout(Some(deadline))
            .map_err(|e| e.to_string())?;
        let mut request =
            format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr).into_bytes();
        if let Some(token) = &self.token {
            request.extend_from_slice(b"Authorization: Bearer ");
            request.extend_from_slice(token);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"Content-Length: 0\r\nConnection: close\r\n\r\n");
        let raw = match &self.tls {
            None => exchange(tcp, &request)?,
            Some((config, name)) => {
                let tls = holdfast::tls::connect_blocking(config.clone(), name.clone(), tcp)
                    .map_err(|e| format!("TLS: {e}"))?;
                exchange(tls, &request)?
            }
        };
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP header")?;
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or("no HTTP status")?;
        // The admin port always sends Content-Length: an answer cut short (a connection lost, or
        // cut without TLS's close_notify by someone on the path) is an error, not an answer.
        let length = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        });
        let head_len = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("no HTTP header")?;
        let got = raw.len() - head_len - 4; // the body's bytes as received
        if length != Some(got) {
            return Err(format!(
                "an incomplete answer ({got} of {} body bytes)",
                length.map_or("?".to_string(), |n| n.to_string())
            ));
        }
        Ok((code, body.to_string()))
    }
}

/// The host of `HOST:PORT` (`[V6]:PORT` too), the name a TLS server's certificate must carry.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Send `request`, read the answer to its end (at most 16 MiB).
fn exchange(mut s: impl std::io::Read + Write, request: &[u8]) -> Result<Vec<u8>, String> {
    s.write_all(request).map_err(|e| e.to_string())?;
    s.flush().map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(raw),
            Ok(n) if raw.len() + n > 16 << 20 => return Err("answer over 16 MiB".into()),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A peer that closes without TLS's close_notify after a whole answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {
                return Ok(raw)
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
