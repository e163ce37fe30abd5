//! One admin connection: the TLS handshake when the port speaks HTTPS, then one request read
//! under the caps, checked against the admin token, routed, answered, and the connection closed.
//!
//! It owns the connection's socket only; data comes from the owner through [`Ctx::ask`].

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::{render, Ctx, MAX_HEADERS, MAX_REQUEST_BYTES, REQUEST_DEADLINE, WRITE_DEADLINE};
use crate::server::query::{Answer, Query, Table, DEFAULT_LIST, MAX_LIST};

/// The status page, served as is (no external assets).
const PAGE: &str = include_str!("page.html");
/// Locks per table on the status page.
const STATUS_LIST: usize = 200;

pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// More header lines, each ending in CRLF.
    pub headers: &'static str,
}

impl Response {
    fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type,
            body: body.into(),
            headers: "",
        }
    }

    fn text(status: u16, body: impl Into<String>) -> Response {
        let mut body: String = body.into();
        body.push('\n');
        Response::new(status, "text/plain; charset=utf-8", body)
    }

    pub fn busy() -> Response {
        Response::text(503, "too many admin connections")
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Write the whole response (head only for HEAD).
pub fn write_response(
    stream: &mut impl Write,
    r: &Response,
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n{}",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len(),
        r.headers,
    )
    .into_bytes();
    if r.status == 405 {
        out.extend_from_slice(b"Allow: GET, HEAD\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_only {
        out.extend_from_slice(&r.body);
    }
    stream.write_all(&out)?;
    stream.flush()
}

/// A connection the admin port serves: plain TCP or TLS over it.
trait Stream: Read + Write {
    fn tcp(&self) -> &TcpStream;
    /// Say that nothing more comes (TLS: close_notify), before the socket is closed.
    fn finish(&mut self) {}
}

impl Stream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Stream for crate::tls::DeadlineServerStream {
    fn tcp(&self) -> &TcpStream {
        &self.sock.tcp
    }

    fn finish(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
    }
}

/// Serve one connection on a blocking socket, then close it: over TLS when the port speaks
/// HTTPS (the handshake bounded by `--tls-handshake-timeout`), else plain.
pub fn serve(stream: TcpStream, peer: SocketAddr, ctx: &Ctx) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    if !ctx.tls {
        let mut stream = stream;
        return serve_on(&mut stream, peer, ctx);
    }
    // The certificate in force now (a SIGHUP's new one serves the connections after it).
    let Some(config) = ctx.shared.secrets.current().server.clone() else {
        return;
    };
    let limit = Duration::from_millis(ctx.shared.config.tls_handshake_timeout_ms.max(1));
    let _ = stream.set_read_timeout(Some(limit));
    let _ = stream.set_write_timeout(Some(limit));
    let started = Instant::now();
    match crate::tls::accept_blocking(config, stream, started + limit) {
        Ok(mut tls) => {
            // Every read and write of the request and its answer ends by then, however a
            // client trickles its records (a plain socket timeout counts from each byte).
            tls.sock.deadline = Instant::now() + REQUEST_DEADLINE + WRITE_DEADLINE;
            serve_on(&mut tls, peer, ctx)
        }
        Err(e) => {
            let why = if started.elapsed() >= limit {
                format!("no handshake within {} ms", limit.as_millis())
            } else {
                e.to_string()
            };
            crate::log_debug!("admin: closed {peer}: TLS handshake failed: {why}");
        }
    }
}

/// Read one request under the caps and deadlines, answer it, close.
fn serve_on<S: Stream>(stream: &mut S, peer: SocketAddr, ctx: &Ctx) {
    let _ = stream.tcp().set_write_timeout(Some(WRITE_DEADLINE));
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            crate::log_info!(
                "admin: closed {peer}: no complete request within {} s",
                REQUEST_DEADLINE.as_secs()
            );
            let _ = write_response(stream, &Response::text(408, "request timeout"), false);
            stream.finish();
            return;
        }
        if len == buf.len() {
            crate::log_info!("admin: closed {peer}: request head over {MAX_REQUEST_BYTES} bytes");
            let r = Response::text(431, "request head too large");
            let _ = write_response(stream, &r, false);
            stream.finish();
            return;
        }
        let _ = stream
            .tcp()
            .set_read_timeout(Some(left.max(Duration::from_millis(1))));
        match stream.read(&mut buf[len..]) {
            Ok(0) => return,
            Ok(n) => len += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let (response, head_only) = match req.parse(&buf[..len]) {
            Ok(httparse::Status::Partial) => continue,
            Ok(httparse::Status::Complete(_)) => {
                let head_only = req.method == Some("HEAD");
                // The token before the route: an unauthenticated client learns nothing of
                // what exists.
                let response = match authorize(&req, peer, ctx) {
                    Ok(()) => route(&req, ctx),
                    Err(refusal) => refusal,
                };
                (response, head_only)
            }
            Err(httparse::Error::TooManyHeaders) => {
                (Response::text(431, "too many header fields"), false)
            }
            Err(e) => (Response::text(400, format!("bad request: {e}")), false),
        };
        if response.status == 400 || response.status == 431 {
            crate::log_info!("admin: closed {peer}: bad request ({})", response.status);
        }
        let _ = write_response(stream, &response, head_only);
        stream.finish();
        return;
    }
}

/// The path of a request target, without its query.
fn path_of<'a>(req: &httparse::Request<'_, 'a>) -> &'a str {
    let target = req.path.unwrap_or("/");
    target.split_once('?').map_or(target, |(p, _)| p)
}

/// Whether a request may go on to routing. With `--admin-token-file`, every request but a GET
/// or HEAD of `/healthz` or `/metrics` needs the token (else 401); without it, a membership
/// change is taken only from a loopback address (else 403).
fn authorize(req: &httparse::Request<'_, '_>, peer: SocketAddr, ctx: &Ctx) -> Result<(), Response> {
    let path = path_of(req);
    let secrets = ctx.shared.secrets.current();
    let Some(token) = secrets.admin_token.as_deref() else {
        let change = req.method == Some("POST") && is_change(path);
        if change && !is_loopback(peer.ip()) {
            return Err(Response::text(
                403,
                "membership changes are taken from loopback addresses only (or set --admin-token-file)",
            ));
        }
        return Ok(());
    };
    let open =
        matches!(req.method, Some("GET" | "HEAD")) && matches!(path, "/healthz" | "/metrics");
    if open {
        return Ok(());
    }
    let given = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("authorization"))
        .map(|h| h.value);
    if given.is_some_and(|v| token_matches(v, token)) {
        return Ok(());
    }
    let mut r = Response::text(
        401,
        "unauthorized: send the admin token (Bearer, or Basic password)",
    );
    r.headers = "WWW-Authenticate: Basic realm=\"holdfast\", charset=\"UTF-8\"\r\nWWW-Authenticate: Bearer realm=\"holdfast\"\r\n";
    Err(r)
}

fn is_change(path: &str) -> bool {
    matches!(path, "/cluster/add" | "/cluster/remove")
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// An `Authorization` value that carries `token`: `Bearer TOKEN`, or `Basic` with any user name
/// and the token as password. Compared in constant time.
fn token_matches(value: &[u8], token: &[u8]) -> bool {
    let value = value.trim_ascii();
    let Some(sp) = value.iter().position(|&b| b == b' ') else {
        return false;
    };
    let (scheme, credentials) = (&value[..sp], value[sp + 1..].trim_ascii());
    if scheme.eq_ignore_ascii_case(b"bearer") {
        return crate::tls::constant_time_eq(credentials, token);
    }
    if scheme.eq_ignore_ascii_case(b"basic") {
        let Some(decoded) = base64_decode(credentials) else {
            return false;
        };
        let Some(colon) = decoded.iter().position(|&b| b == b':') else {
            return false;
        };
        return crate::tls::constant_time_eq(&decoded[colon + 1..], token);
    }
    false
}

/// Standard base64 (RFC 4648, `=` padding optional); `None` for anything else.
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    let text = text
        .strip_suffix(b"==")
        .or_else(|| text.strip_suffix(b"="))
        .unwrap_or(text);
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for &c in text {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// Whether a browser sent this request from another site's page: a form on any web page can
/// POST to a loopback address (no preflight for a POST without a body), and a browser adds the
/// Basic credentials it has for the admin port by itself. Browsers say where a request comes
/// from (`Sec-Fetch-Site`, `Origin`); `holdfast cluster` and curl send neither.
fn cross_site(req: &httparse::Request<'_, '_>) -> bool {
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    if let Some(site) = header("sec-fetch-site") {
        if site != b"same-origin" && site != b"none" {
            return true;
        }
    }
    match (header("origin"), header("host")) {
        (None, _) => false,
        (Some(origin), Some(host)) => {
            let rest = origin
                .strip_prefix(b"http://")
                .or_else(|| origin.strip_prefix(b"https://"));
            rest != Some(host)
        }
        (Some(_), None) => true,
    }
}

fn route(req: &httparse::Request<'_, '_>, ctx: &Ctx) -> Response {
    let target = req.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    // Membership changes are the only requests that change anything: POST, and only they.
    let changes = is_change(path);
    match req.method {
        Some("POST") if changes => {}
        Some("GET") | Some("HEAD") if !changes => {}
        _ if changes => return Response::text(405, "membership changes are POSTs"),
        _ => return Response::text(405, "only GET and HEAD"),
    }
    for h in req.headers.iter() {
        let body = h.name.eq_ignore_ascii_case("transfer-encoding")
            || (h.name.eq_ignore_ascii_case("content-length") && h.value != b"0");
        if body {
            return Response::text(413, "a GET takes no request body");
        }
    }
    if changes && cross_site(req) {
        return Response::text(
            403,
            "membership changes are not taken from another site's page",
        );
    }
    let params = match parse_query(query) {
        Ok(p) => p,
        Err(e) => return Response::text(400, e),
    };
    match path {
        "/" | "/index.html" => Response::new(200, "text/html; charset=utf-8", PAGE),
        "/healthz" => healthz(ctx),
        "/metrics" => match ctx.ask(Query::Metrics) {
            Some(Answer::Metrics(s)) => Response::new(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                render::metrics(&s, ctx),
            ),
            _ => owner_busy(),
        },
        "/status.json" => match ctx.ask(Query::Status { limit: STATUS_LIST }) {
            Some(Answer::Status(s, lists)) => {
                Response::new(200, "application/json", render::status(&s, &lists, ctx))
            }
            _ => owner_busy(),
        },
        "/locks" => match locks_query(&params) {
            Err(e) => Response::text(400, e),
            Ok(q) => match ctx.ask(q) {
                Some(Answer::Locks(l)) => Response::new(200, "application/json", render::locks(&l)),
                _ => owner_busy(),
            },
        },
        "/cluster" => match ctx.ask(Query::Cluster) {
            Some(Answer::Cluster(Some(c))) => {
                Response::new(200, "application/json", render::cluster(&c))
            }
            Some(Answer::Cluster(None)) => Response::text(404, "not a cluster node (no --peers)"),
            _ => owner_busy(),
        },
        "/cluster/add" | "/cluster/remove" => match member_change(path, &params) {
            Err(e) => Response::text(400, e),
            Ok(change) => match ctx.ask(Query::ClusterChange(change)) {
                Some(Answer::ClusterChange(Ok(text))) => Response::text(202, text),
                Some(Answer::ClusterChange(Err((code, why)))) => Response::text(code, why),
                _ => owner_busy(),
            },
        },
        _ => Response::text(
            404,
            "not found: try /, /metrics, /locks?table=T, /healthz, /cluster",
        ),
    }
}

/// `/cluster/add?id=N&addr=HOST:PORT` or `/cluster/remove?id=N`.
fn member_change(
    path: &str,
    params: &[(String, Vec<u8>)],
) -> Result<crate::server::query::MemberChange, String> {
    use crate::server::query::MemberChange;
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    };
    if let Some((k, _)) = params.iter().find(|(k, _)| k != "id" && k != "addr") {
        return Err(format!("unknown parameter {k:?}"));
    }
    let id: u64 = get("id")
        .and_then(|v| v.parse().ok())
        .filter(|&n| (1..=u64::from(u16::MAX)).contains(&n))
        .ok_or("id: a node id, 1 to 65535")?;
    if path == "/cluster/remove" {
        if get("addr").is_some() {
            return Err("remove takes only an id".into());
        }
        return Ok(MemberChange::Remove(id));
    }
    let addr = get("addr")
        .and_then(|v| v.parse().ok())
        .ok_or("addr: the new node's peer address, HOST:PORT (an IP address)")?;
    Ok(MemberChange::Add(id, addr))
}

fn owner_busy() -> Response {
    Response::text(503, "the owner thread did not answer in time")
}

fn healthz(ctx: &Ctx) -> Response {
    if ctx
        .shared
        .shutdown
        .load(std::sync::atomic::Ordering::Acquire)
    {
        return Response::text(503, "shutting down");
    }
    match ctx.ask(Query::Ping) {
        Some(Answer::Pong) => Response::text(200, "ok"),
        Some(Answer::Unhealthy(why)) => Response::text(503, why),
        _ => Response::text(
            503,
            format!(
                "the owner thread did not answer within {} ms",
                super::OWNER_DEADLINE.as_millis()
            ),
        ),
    }
}

/// `/locks` parameters: `table` (required), `prefix`, `limit` (1 or more; capped at MAX_LIST).
fn locks_query(params: &[(String, Vec<u8>)]) -> Result<Query, String> {
    let mut table = None;
    let mut prefix = Vec::new();
    let mut limit = DEFAULT_LIST;
    for (k, v) in params {
        match k.as_str() {
            "table" => {
                table = Some(Table::parse(v).ok_or("table: one of memcache, lockd, dlock")?);
            }
            "prefix" => prefix = v.clone(),
            "limit" => {
                let n: usize = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("limit: a positive number")?;
                limit = n.min(MAX_LIST);
            }
            other => return Err(format!("unknown parameter {other:?}")),
        }
    }
    Ok(Query::Locks {
        table: table.ok_or("table is required: memcache, lockd or dlock")?,
        prefix,
        limit,
    })
}

/// Split and percent-decode `a=b&c=d` (`+` is a space). A parameter given twice is an error.
pub fn parse_query(q: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for part in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let k = String::from_utf8(decode(k)?).map_err(|_| "parameter name not UTF-8")?;
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(format!("parameter {k:?} given twice"));
        }
        out.push((k, decode(v)?));
    }
    Ok(out)
}

fn decode(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b.get(i + 1..i + 3).ok_or("truncated %-escape")?;
                let hex = std::str::from_utf8(hex).map_err(|_| "bad %-escape")?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad %-escape")?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_taken_as_bearer_or_as_a_basic_password() {
        let t = b"s3cret-token";
        for ok in [
            &b"Bearer s3cret-token"[..],
            b"bearer s3cret-token",
            b"  Bearer   s3cret-token ",
            // base64("admin:s3cret-token"), base64(":s3cret-token"), base64("a:b:s3cret-token")
            b"Basic YWRtaW46czNjcmV0LXRva2Vu",
            b"basic OnMzY3JldC10b2tlbg==",
            b"Basic OnMzY3JldC10b2tlbg",
        ] {
            assert!(token_matches(ok, t), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b""[..],
            b"Bearer",
            b"Bearer s3cret-toke",
            b"Bearer s3cret-token2",
            b"Bearers3cret-token",
            b"Token s3cret-token",
            b"s3cret-token",
            // base64("s3cret-token"): no colon; base64("admin:wrong")
            b"Basic czNjcmV0LXRva2Vu",
            b"Basic YWRtaW46d3Jvbmc=",
            b"Basic !!!!",
            b"Basic YWRtaW46czNjcmV0LXRva2Vu=x",
        ] {
            assert!(!token_matches(bad, t), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode(b"").unwrap(), b"");
        assert_eq!(base64_decode(b"YQ==").unwrap(), b"a");
        assert_eq!(base64_decode(b"YWI=").unwrap(), b"ab");
        assert_eq!(base64_decode(b"YWJj").unwrap(), b"abc");
        assert_eq!(base64_decode(b"YWJjZA").unwrap(), b"abcd");
        assert_eq!(base64_decode(b"+/+/").unwrap(), [0xfb, 0xff, 0xbf]);
        for bad in [&b"Y"[..], b"Y=Q=", b"YW\n", b"YWJjZ"] {
            assert!(base64_decode(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn loopback_addresses_include_mapped_ones() {
        for ip in ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.0.0.1", "0.0.0.0", "::", "::ffff:10.0.0.1", "fe80::1"] {
            assert!(!is_loopback(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn query_strings_decode_and_refuse_what_is_malformed() {
        type Params = &'static [(&'static str, &'static [u8])];
        let ok: &[(&str, Params)] = &[
            ("", &[]),
            ("table=lockd", &[("table", b"lockd")]),
            (
                "prefix=a%2Fb+c&limit=5",
                &[("prefix", b"a/b c"), ("limit", b"5")],
            ),
            ("prefix=%00%ff", &[("prefix", b"\x00\xff")]),
            ("flag", &[("flag", b"")]),
            ("&&a=1&", &[("a", b"1")]),
        ];
        for (q, want) in ok {
            let got = parse_query(q).unwrap();
            let want: Vec<(String, Vec<u8>)> = want
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect();
            assert_eq!(got, want, "{q}");
        }
        for bad in ["a=%", "a=%4", "a=%zz", "a=1&a=2", "%ff=1"] {
            assert!(parse_query(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn membership_change_parameters_are_checked() {
        use crate::server::query::MemberChange;
        let q = |path: &str, s: &str| member_change(path, &parse_query(s).unwrap());
        let add = "/cluster/add";
        let remove = "/cluster/remove";
        assert_eq!(
            q(add, "id=4&addr=127.0.0.1:2628").unwrap(),
            MemberChange::Add(4, "127.0.0.1:2628".parse().unwrap())
        );
        assert_eq!(q(remove, "id=65535").unwrap(), MemberChange::Remove(65535));
        for (path, bad) in [
            (add, "id=4"),
            (add, "addr=127.0.0.1:1"),
            (add, "id=0&addr=127.0.0.1:1"),
            (add, "id=65536&addr=127.0.0.1:1"),
            (add, "id=4&addr=example.com:1"),
            (add, "id=4&addr=127.0.0.1:1&extra=1"),
            (remove, "id=-1"),
            (remove, "id=3&addr=127.0.0.1:1"),
            (remove, ""),
        ] {
            assert!(q(path, bad).is_err(), "{path}?{bad}");
        }
    }

    #[test]
    fn locks_parameters_are_checked() {
        let q = |s: &str| locks_query(&parse_query(s).unwrap());
        assert!(matches!(
            q("table=dlock&limit=999999").unwrap(),
            Query::Locks {
                table: Table::Dlock,
                limit: MAX_LIST,
                ..
            }
        ));
        assert!(matches!(
            q("table=memcache").unwrap(),
            Query::Locks {
                limit: DEFAULT_LIST,
                ..
            }
        ));
        for bad in [
            "",
            "table=redis",
            "table=lockd&limit=0",
            "table=lockd&limit=-1",
            "table=lockd&x=1",
        ] {
            assert!(q(bad).is_err(), "{bad}");
        }
    }
}
