//! A minimal D-Bus client: enough of the wire protocol to read a few properties over the
//! system bus (`org.freedesktop.DBus.Properties.Get`), which is all the conditions need.
//! Blocking, on a Unix socket with a timeout, with no thread of its own: a crate (`zbus`)
//! would bring an executor and some forty dependencies, libdbus a C library to link, for
//! three calls every few seconds.
//!
//! The protocol: a NUL byte and `AUTH EXTERNAL <uid in hex>` (the kernel vouches for the uid
//! through the socket), `BEGIN`, then little-endian messages: a 16-byte fixed header, an
//! array of header fields (path, interface, member, destination, signature, reply serial),
//! padding to 8 bytes, and the body. See the D-Bus specification, "Message Protocol".

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Where the system bus is when `DBUS_SYSTEM_BUS_ADDRESS` does not say.
const SYSTEM_BUS: &str = "unix:path=/var/run/dbus/system_bus_socket";

/// The longest a call may take: a bus that does not answer in this time counts as absent.
const CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// A message larger than this is refused (a property reply is a few hundred bytes).
const MAX_MESSAGE: usize = 1 << 20;

/// A value of a property, as far as the conditions need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value {
    /// `u` (also `i`, `y` and `n` widened).
    U32(u32),
    /// `b`.
    Bool(bool),
    /// Any other type.
    Other,
}

/// A connection to a bus, after `Hello`.
pub(crate) struct Bus {
    stream: UnixStream,
    serial: u32,
}

impl Bus {
    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket).
    pub(crate) fn system() -> std::io::Result<Bus> {
        let address =
            std::env::var("DBUS_SYSTEM_BUS_ADDRESS").unwrap_or_else(|_| SYSTEM_BUS.to_owned());
        Bus::connect(&address)
    }

    /// Connects to the first `unix:path=` or `unix:abstract=` address of `address` that
    /// answers, authenticates and says `Hello`.
    pub(crate) fn connect(address: &str) -> std::io::Result<Bus> {
        let mut last = std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("no unix:path or unix:abstract address in {address:?}"),
        );
        for one in address.split(';') {
            let Some(keys) = one.strip_prefix("unix:") else {
                continue;
            };
            let key = |k: &str| {
                keys.split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            };
            let stream = if let Some(path) = key("path") {
                UnixStream::connect(unescape(path))
            } else if let Some(name) = key("abstract") {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(unescape(name).as_bytes())
                    .and_then(|a| UnixStream::connect_addr(&a))
            } else {
                continue;
            };
            match stream.and_then(Bus::open) {
                Ok(bus) => return Ok(bus),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open(stream: UnixStream) -> std::io::Result<Bus> {
        stream.set_read_timeout(Some(CALL_TIMEOUT))?;
        stream.set_write_timeout(Some(CALL_TIMEOUT))?;
        let mut bus = Bus { stream, serial: 0 };
        let uid = nix::unistd::geteuid().as_raw().to_string();
        let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        bus.stream
            .write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())?;
        let line = bus.read_line()?;
        if !line.starts_with("OK ") {
            return Err(protocol(format!("the bus refused authentication: {line}")));
        }
        bus.stream.write_all(b"BEGIN\r\n")?;
        bus.call(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "Hello",
            "",
            &[],
        )?;
        Ok(bus)
    }

    fn read_line(&mut self) -> std::io::Result<String> {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            self.stream.read_exact(&mut byte)?;
            line.push(byte[0]);
            if line.len() > 512 {
                return Err(protocol("the bus's authentication line is too long".into()));
            }
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    /// The property `name` of `interface` on `destination`'s object `path`.
    ///
    /// # Errors
    ///
    /// The bus is gone or did not answer in time, or the call failed (no such service or
    /// property: the error's text is the D-Bus error name).
    pub(crate) fn get(
        &mut self,
        destination: &str,
        path: &str,
        interface: &str,
        name: &str,
    ) -> std::io::Result<Value> {
        let mut body = Vec::new();
        put_string(&mut body, interface);
        put_string(&mut body, name);
        let (signature, body) = self.call(
            destination,
            path,
            "org.freedesktop.DBus.Properties",
            "Get",
            "ss",
            &body,
        )?;
        if signature != "v" {
            return Err(protocol(format!("a Get reply of signature {signature:?}")));
        }
        read_variant(&body)
    }

    /// Sends a method call and waits for its reply (skipping signals and other messages):
    /// the reply's signature and body.
    fn call(
        &mut self,
        destination: &str,
        path: &str,
        interface: &str,
        member: &str,
        signature: &str,
        body: &[u8],
    ) -> std::io::Result<(String, Vec<u8>)> {
        self.serial = self.serial.wrapping_add(1).max(1);
        let serial = self.serial;
        let mut fields = Vec::new();
        field(&mut fields, 1, 'o', path);
        field(&mut fields, 2, 's', interface);
        field(&mut fields, 3, 's', member);
        field(&mut fields, 6, 's', destination);
        if !signature.is_empty() {
            field(&mut fields, 8, 'g', signature);
        }
        let mut msg = vec![b'l', 1, 0, 1];
        msg.extend(u32_len(body.len())?.to_le_bytes());
        msg.extend(serial.to_le_bytes());
        msg.extend(u32_len(fields.len())?.to_le_bytes());
        msg.extend(&fields);
        pad(&mut msg, 8);
        msg.extend(body);
        self.stream.write_all(&msg)?;
        loop {
            let reply = self.read_message()?;
            if reply.reply_serial != Some(serial) {
                continue;
            }
            return match reply.kind {
                2 => Ok((reply.signature, reply.body)),
                // The bus answered: the connection is sound, the service or property is not.
                _ => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    reply.error.unwrap_or_else(|| format!("{member} failed")),
                )),
            };
        }
    }

    fn read_message(&mut self) -> std::io::Result<Message> {
        let mut fixed = [0u8; 16];
        self.stream.read_exact(&mut fixed)?;
        if fixed[0] != b'l' {
            return Err(protocol("a big-endian message".into()));
        }
        let word =
            |i: usize| u32::from_le_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]);
        let body_len = word(4) as usize;
        let fields_len = word(12) as usize;
        let padded = fields_len.div_ceil(8) * 8;
        if body_len + padded > MAX_MESSAGE {
            return Err(protocol("a message too large".into()));
        }
        let mut rest = vec![0u8; padded + body_len];
        self.stream.read_exact(&mut rest)?;
        let mut msg = Message {
            kind: fixed[1],
            reply_serial: None,
            signature: String::new(),
            error: None,
            body: rest.split_off(padded),
        };
        // The fields, as read from offset 16 of the message: alignment counts from its start.
        let mut r = Reader {
            buf: &rest[..fields_len],
            pos: 0,
            base: 16,
        };
        while r.pos < r.buf.len() {
            r.align(8)?;
            let code = r.byte()?;
            let sig = r.signature()?;
            match (code, sig.as_str()) {
                (5, "u") => msg.reply_serial = Some(r.u32()?),
                (8, "g") => msg.signature = r.signature()?,
                (4, "s") => msg.error = Some(r.string()?),
                (_, "s" | "o") => {
                    r.string()?;
                }
                (_, "g") => {
                    r.signature()?;
                }
                (_, "u") => {
                    r.u32()?;
                }
                _ => return Err(protocol(format!("a header field of type {sig:?}"))),
            }
        }
        Ok(msg)
    }
}

struct Message {
    kind: u8,
    reply_serial: Option<u32>,
    signature: String,
    error: Option<String>,
    body: Vec<u8>,
}

/// Reads the body of a `v` reply.
fn read_variant(body: &[u8]) -> std::io::Result<Value> {
    let mut r = Reader {
        buf: body,
        pos: 0,
        base: 0,
    };
    let sig = r.signature()?;
    Ok(match sig.as_str() {
        "u" | "i" => Value::U32(r.u32()?),
        "b" => Value::Bool(r.u32()? != 0),
        "y" => Value::U32(u32::from(r.byte()?)),
        _ => Value::Other,
    })
}

/// A reader of marshalled values, aligned from `base`.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl Reader<'_> {
    fn align(&mut self, n: usize) -> std::io::Result<()> {
        while (self.base + self.pos) % n != 0 {
            self.byte()?;
        }
        Ok(())
    }

    fn byte(&mut self) -> std::io::Result<u8> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| protocol("a message cut short".into()))?;
        self.pos += 1;
        Ok(b)
    }

    fn u32(&mut self) -> std::io::Result<u32> {
        self.align(4)?;
        let mut b = [0u8; 4];
        for x in &mut b {
            *x = self.byte()?;
        }
        Ok(u32::from_le_bytes(b))
    }

    fn bytes(&mut self, n: usize) -> std::io::Result<String> {
        let end = self.pos.checked_add(n).filter(|&e| e < self.buf.len());
        let end = end.ok_or_else(|| protocol("a message cut short".into()))?;
        let s = String::from_utf8_lossy(&self.buf[self.pos..end]).into_owned();
        // The string, then its NUL.
        self.pos = end + 1;
        Ok(s)
    }

    fn string(&mut self) -> std::io::Result<String> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }

    fn signature(&mut self) -> std::io::Result<String> {
        let n = usize::from(self.byte()?);
        self.bytes(n)
    }
}

fn u32_len(n: usize) -> std::io::Result<u32> {
    u32::try_from(n).map_err(|_| protocol("a message too large".into()))
}

fn pad(buf: &mut Vec<u8>, n: usize) {
    while buf.len() % n != 0 {
        buf.push(0);
    }
}

/// Appends a string (`s` or `o`), aligned as in a message that starts at 0 (the body) or
/// 16 (the fields: 16 is a multiple of 8, so the same).
fn put_string(buf: &mut Vec<u8>, s: &str) {
    pad(buf, 4);
    buf.extend((s.len() as u32).to_le_bytes());
    buf.extend(s.as_bytes());
    buf.push(0);
}

/// Appends a header field: a struct of its code and a variant of one basic type.
fn field(buf: &mut Vec<u8>, code: u8, kind: char, value: &str) {
    pad(buf, 8);
    buf.extend([code, 1, kind as u8, 0]);
    if kind == 'g' {
        buf.push(value.len() as u8);
        buf.extend(value.as_bytes());
        buf.push(0);
    } else {
        put_string(buf, value);
    }
}

/// Undoes the `%XX` escapes of an address's value.
fn unescape(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn protocol(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}
