//! The kernel NBD driver's generic netlink family ("nbd",
//! include/uapi/linux/nbd-netlink.h): CONNECT, RECONFIGURE, DISCONNECT and
//! STATUS, as requests built by pure functions (unit tested) and sent by
//! [`NbdNetlink`].
//!
//! What the driver does with them (drivers/block/nbd.c, Linux 6.12):
//! CONNECT configures device `index` with the given sockets (file
//! descriptors of the sending process, taken by reference), size, block
//! size, server flags and, if given, a dead-connection timeout: when every
//! socket is dead, requests wait up to that long for RECONFIGURE to hand
//! it a new one, instead of failing. RECONFIGURE replaces dead sockets only
//! (and answers success when it found none: see [`super::KernelDevice`] for how
//! that is told apart); a device connected with a backend identifier
//! accepts it only with the same identifier. DISCONNECT sends NBD_CMD_DISC
//! on every socket, shuts them down and fails what is left in flight.
//! STATUS tells whether a device has a configuration (a connected device,
//! or one whose server died and whose requests wait).

use super::genetlink::{self, DecodeError, Request};
use super::socket::NetlinkSocket;
use std::io;
use std::os::fd::RawFd;

/// The family's name and version.
pub const FAMILY_NAME: &str = "nbd";
const VERSION: u8 = 1;

const CMD_CONNECT: u8 = 1;
const CMD_DISCONNECT: u8 = 2;
const CMD_RECONFIGURE: u8 = 3;
const CMD_STATUS: u8 = 5;

const ATTR_INDEX: u16 = 1;
const ATTR_SIZE_BYTES: u16 = 2;
const ATTR_BLOCK_SIZE_BYTES: u16 = 3;
const ATTR_SERVER_FLAGS: u16 = 5;
const ATTR_SOCKETS: u16 = 7;
const ATTR_DEAD_CONN_TIMEOUT: u16 = 8;
const ATTR_DEVICE_LIST: u16 = 9;
const ATTR_BACKEND_IDENTIFIER: u16 = 10;
const SOCK_ITEM: u16 = 1;
const SOCK_FD: u16 = 1;
const DEVICE_ITEM: u16 = 1;
const DEVICE_INDEX: u16 = 1;
const DEVICE_CONNECTED: u16 = 2;

/// What NBD_CMD_CONNECT configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// The N of /dev/nbdN.
    pub index: u32,
    pub size: u64,
    /// Logical (and physical) block size: a power of two, 512 to the page size.
    pub block_size: u64,
    /// The export's transmission flags, as negotiated.
    pub server_flags: u16,
    /// Seconds requests wait for a new socket when every socket is dead
    /// (0: they fail at once).
    pub dead_conn_timeout: u64,
    /// Who serves it: a RECONFIGURE must name the same.
    pub backend: String,
    /// Connected sockets, negotiated, of this process.
    pub sockets: Vec<RawFd>,
}

fn with_sockets(mut r: Request, sockets: &[RawFd]) -> Request {
    r = r.begin_nested(ATTR_SOCKETS);
    for &fd in sockets {
        r = r
            .begin_nested(SOCK_ITEM)
            .u32(SOCK_FD, fd as u32)
            .end_nested();
    }
    r.end_nested()
}

/// The NBD_CMD_CONNECT request.
pub fn connect_request(family: u16, seq: u32, c: &Connect) -> Vec<u8> {
    let r = Request::new(family, CMD_CONNECT, VERSION, seq)
        .u32(ATTR_INDEX, c.index)
        .u64(ATTR_SIZE_BYTES, c.size)
        .u64(ATTR_BLOCK_SIZE_BYTES, c.block_size)
        .u64(ATTR_SERVER_FLAGS, u64::from(c.server_flags))
        .u64(ATTR_DEAD_CONN_TIMEOUT, c.dead_conn_timeout)
        .string(ATTR_BACKEND_IDENTIFIER, &c.backend);
    with_sockets(r, &c.sockets).finish()
}

/// The NBD_CMD_RECONFIGURE request: new sockets for the dead ones of
/// device `index` (connected with backend identifier `backend`), and the
/// dead-connection timeout again.
pub fn reconfigure_request(
    family: u16,
    seq: u32,
    index: u32,
    backend: &str,
    dead_conn_timeout: u64,
    sockets: &[RawFd],
) -> Vec<u8> {
    let r = Request::new(family, CMD_RECONFIGURE, VERSION, seq)
        .u32(ATTR_INDEX, index)
        .string(ATTR_BACKEND_IDENTIFIER, backend)
        .u64(ATTR_DEAD_CONN_TIMEOUT, dead_conn_timeout);
    with_sockets(r, sockets).finish()
}

/// The NBD_CMD_DISCONNECT request of device `index`.
pub fn disconnect_request(family: u16, seq: u32, index: u32) -> Vec<u8> {
    Request::new(family, CMD_DISCONNECT, VERSION, seq)
        .u32(ATTR_INDEX, index)
        .finish()
}

/// The NBD_CMD_STATUS request of device `index`.
pub fn status_request(family: u16, seq: u32, index: u32) -> Vec<u8> {
    Request::new(family, CMD_STATUS, VERSION, seq)
        .u32(ATTR_INDEX, index)
        .finish()
}

/// What STATUS says of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceStatus {
    /// No device `index` exists yet (CONNECT makes it).
    Absent,
    /// It exists with no configuration: free to CONNECT.
    Free,
    /// It has a configuration: served, or waiting for a new socket.
    Configured,
}

/// Device `index`'s status in the payload of STATUS's answer.
pub fn parse_status(payload: &[u8], index: u32) -> Result<DeviceStatus, DecodeError> {
    let attrs = genetlink::genl_attrs(payload)?;
    let Some(list) = genetlink::find(&attrs, ATTR_DEVICE_LIST) else {
        return Ok(DeviceStatus::Absent);
    };
    for (ty, item) in genetlink::parse_attrs(list)? {
        if ty != DEVICE_ITEM {
            continue;
        }
        let fields = genetlink::parse_attrs(item)?;
        let Some(i) = genetlink::find(&fields, DEVICE_INDEX) else {
            continue;
        };
        if genetlink::as_u32(i)? != index {
            continue;
        }
        let connected = match genetlink::find(&fields, DEVICE_CONNECTED) {
            Some(c) => genetlink::as_u8(c)? != 0,
            None => false,
        };
        return Ok(if connected {
            DeviceStatus::Configured
        } else {
            DeviceStatus::Free
        });
    }
    Ok(DeviceStatus::Absent)
}

/// The device index in CONNECT's answer.
pub fn parse_connect_reply(payload: &[u8]) -> Result<u32, DecodeError> {
    let attrs = genetlink::genl_attrs(payload)?;
    genetlink::as_u32(
        genetlink::find(&attrs, ATTR_INDEX)
            .ok_or_else(|| DecodeError("no device index in the answer to CONNECT".into()))?,
    )
}

/// A netlink socket with the "nbd" family resolved.
pub struct NbdNetlink {
    socket: NetlinkSocket,
    family: u16,
}

fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl NbdNetlink {
    /// Opens a socket and looks the family up (asking for it loads the
    /// nbd module, through its module alias, where the kernel allows).
    pub fn open() -> io::Result<NbdNetlink> {
        let mut socket = NetlinkSocket::open().map_err(|e| context(e, "netlink socket"))?;
        let seq = socket.next_seq();
        let answers = socket
            .request(&genetlink::get_family_request(FAMILY_NAME, seq), seq)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOENT) {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        "the kernel has no NBD netlink interface: load the nbd module \
                         (modprobe nbd)",
                    )
                } else {
                    context(e, "looking up the nbd netlink family")
                }
            })?;
        let payload = answers.first().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "no answer for the nbd netlink family",
            )
        })?;
        let family = genetlink::family_id(payload)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(NbdNetlink { socket, family })
    }

    fn send(
        &mut self,
        build: impl FnOnce(u16, u32) -> Vec<u8>,
        what: &str,
    ) -> io::Result<Vec<Vec<u8>>> {
        let seq = self.socket.next_seq();
        let request = build(self.family, seq);
        self.socket.request(&request, seq).map_err(|e| {
            if e.raw_os_error() == Some(libc::EPERM) {
                io::Error::new(e.kind(), format!("{what}: permission denied (needs root)"))
            } else {
                context(e, what)
            }
        })
    }

    /// Device `index`'s status.
    pub fn status(&mut self, index: u32) -> io::Result<DeviceStatus> {
        let answers = self.send(|f, s| status_request(f, s, index), "NBD status")?;
        match answers.first() {
            Some(p) => {
                parse_status(p, index).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            }
            None => Ok(DeviceStatus::Absent),
        }
    }

    /// Configures a device (NBD_CMD_CONNECT); its index.
    pub fn connect(&mut self, c: &Connect) -> io::Result<u32> {
        let answers = self.send(|f, s| connect_request(f, s, c), "NBD connect")?;
        match answers.first() {
            Some(p) => {
                parse_connect_reply(p).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            }
            None => Ok(c.index),
        }
    }

    /// Hands device `index` new sockets for its dead ones
    /// (NBD_CMD_RECONFIGURE).
    pub fn reconfigure(
        &mut self,
        index: u32,
        backend: &str,
        dead_conn_timeout: u64,
        sockets: &[RawFd],
    ) -> io::Result<()> {
        self.send(
            |f, s| reconfigure_request(f, s, index, backend, dead_conn_timeout, sockets),
            "NBD reconfigure",
        )
        .map(drop)
    }

    /// Disconnects device `index` (NBD_CMD_DISCONNECT).
    pub fn disconnect(&mut self, index: u32) -> io::Result<()> {
        self.send(|f, s| disconnect_request(f, s, index), "NBD disconnect")
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use genetlink::{find, genl_attrs, genl_cmd, messages, parse_attrs};

    fn u64_of(attrs: &[(u16, &[u8])], ty: u16) -> u64 {
        u64::from_ne_bytes(find(attrs, ty).unwrap().try_into().unwrap())
    }

    #[test]
    fn connect_carries_what_the_driver_requires() {
        let c = Connect {
            index: 3,
            size: 1 << 30,
            block_size: 4096,
            server_flags: 0x12d,
            dead_conn_timeout: 120,
            backend: "tiercache:/dev/sdb#default".into(),
            sockets: vec![7, 9],
        };
        let m = connect_request(0x22, 5, &c);
        let msgs = messages(&m).unwrap();
        assert_eq!(msgs[0].msg_type, 0x22);
        assert_eq!(genl_cmd(msgs[0].payload), Some(CMD_CONNECT));
        assert_eq!(msgs[0].payload[1], VERSION);
        let attrs = genl_attrs(msgs[0].payload).unwrap();
        assert_eq!(
            genetlink::as_u32(find(&attrs, ATTR_INDEX).unwrap()).unwrap(),
            3
        );
        assert_eq!(u64_of(&attrs, ATTR_SIZE_BYTES), 1 << 30);
        assert_eq!(u64_of(&attrs, ATTR_BLOCK_SIZE_BYTES), 4096);
        assert_eq!(u64_of(&attrs, ATTR_SERVER_FLAGS), 0x12d);
        assert_eq!(u64_of(&attrs, ATTR_DEAD_CONN_TIMEOUT), 120);
        assert_eq!(
            find(&attrs, ATTR_BACKEND_IDENTIFIER).unwrap(),
            b"tiercache:/dev/sdb#default\0"
        );
        let fds: Vec<u32> = parse_attrs(find(&attrs, ATTR_SOCKETS).unwrap())
            .unwrap()
            .into_iter()
            .map(|(ty, item)| {
                assert_eq!(ty, SOCK_ITEM);
                let f = parse_attrs(item).unwrap();
                genetlink::as_u32(find(&f, SOCK_FD).unwrap()).unwrap()
            })
            .collect();
        assert_eq!(fds, [7, 9]);
    }

    #[test]
    fn reconfigure_names_device_backend_timeout_and_sockets() {
        let m = reconfigure_request(0x22, 6, 1, "b", 30, &[4]);
        let msgs = messages(&m).unwrap();
        assert_eq!(genl_cmd(msgs[0].payload), Some(CMD_RECONFIGURE));
        let attrs = genl_attrs(msgs[0].payload).unwrap();
        assert_eq!(
            genetlink::as_u32(find(&attrs, ATTR_INDEX).unwrap()).unwrap(),
            1
        );
        assert_eq!(find(&attrs, ATTR_BACKEND_IDENTIFIER).unwrap(), b"b\0");
        assert_eq!(u64_of(&attrs, ATTR_DEAD_CONN_TIMEOUT), 30);
        // No size: a reconfigure must not resize the device.
        assert!(find(&attrs, ATTR_SIZE_BYTES).is_none());
        assert_eq!(
            parse_attrs(find(&attrs, ATTR_SOCKETS).unwrap())
                .unwrap()
                .len(),
            1
        );
        let d = disconnect_request(0x22, 7, 2);
        let msgs = messages(&d).unwrap();
        assert_eq!(genl_cmd(msgs[0].payload), Some(CMD_DISCONNECT));
        let attrs = genl_attrs(msgs[0].payload).unwrap();
        assert_eq!(
            genetlink::as_u32(find(&attrs, ATTR_INDEX).unwrap()).unwrap(),
            2
        );
    }

    #[test]
    fn numbers_are_the_kernels() {
        // include/uapi/linux/nbd-netlink.h: the enums, in order.
        assert_eq!(
            [CMD_CONNECT, CMD_DISCONNECT, CMD_RECONFIGURE, CMD_STATUS],
            [1, 2, 3, 5]
        );
        assert_eq!(
            [
                ATTR_INDEX,
                ATTR_SIZE_BYTES,
                ATTR_BLOCK_SIZE_BYTES,
                ATTR_SERVER_FLAGS,
                ATTR_SOCKETS,
                ATTR_DEAD_CONN_TIMEOUT,
                ATTR_DEVICE_LIST,
                ATTR_BACKEND_IDENTIFIER
            ],
            [1, 2, 3, 5, 7, 8, 9, 10]
        );
        assert_eq!(
            [
                SOCK_ITEM,
                SOCK_FD,
                DEVICE_ITEM,
                DEVICE_INDEX,
                DEVICE_CONNECTED
            ],
            [1, 1, 1, 1, 2]
        );
        assert_eq!((FAMILY_NAME, VERSION), ("nbd", 1));
    }

    /// STATUS's answer as nbd_genl_status builds it.
    fn status_answer(devices: &[(u32, u8)]) -> Vec<u8> {
        let mut r = Request::new(0x22, CMD_STATUS, VERSION, 1).begin_nested(ATTR_DEVICE_LIST);
        for &(index, connected) in devices {
            r = r
                .begin_nested(DEVICE_ITEM)
                .u32(DEVICE_INDEX, index)
                .u8(DEVICE_CONNECTED, connected)
                .end_nested();
        }
        let m = r.end_nested().finish();
        messages(&m).unwrap()[0].payload.to_vec()
    }

    #[test]
    fn status_tells_absent_free_and_configured_apart() {
        let p = status_answer(&[(0, 0), (1, 1)]);
        assert_eq!(parse_status(&p, 0).unwrap(), DeviceStatus::Free);
        assert_eq!(parse_status(&p, 1).unwrap(), DeviceStatus::Configured);
        assert_eq!(parse_status(&p, 2).unwrap(), DeviceStatus::Absent);
        assert_eq!(
            parse_status(&status_answer(&[]), 0).unwrap(),
            DeviceStatus::Absent
        );
        let reply = Request::new(0x22, CMD_CONNECT, VERSION, 1)
            .u32(ATTR_INDEX, 4)
            .finish();
        assert_eq!(
            parse_connect_reply(messages(&reply).unwrap()[0].payload).unwrap(),
            4
        );
    }

    proptest::proptest! {
        #[test]
        fn status_decoder_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), index in 0u32..4) {
            let _ = parse_status(&bytes, index);
            let _ = parse_connect_reply(&bytes);
        }
    }
}
