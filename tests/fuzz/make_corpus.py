#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs into corpus/<target>/ (committed; run again
only when a format changes). Each seed is one well-formed input, or one a decoder
must refuse, so that the fuzzers start from every frame type and field."""
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    path = os.path.join(here, "corpus", target)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)


# agent/fabric/wire.h: u32 magic, u16 version, u16 type, u32 word0..2, u32 reserved,
# u64 dword0, dword1 (a 16-byte nonce in HELLO and CHALLENGE); CHALLENGE and PROOF
# are followed by a 32-byte MAC.
def tcp(type_, w0=0, w1=0, w2=0, d0=0, d1=0, magic=0x4B4E4C46):
    return struct.pack("<IHHIIIIQQ", magic, 3, type_, w0, w1, w2, 0, d0, d1)


nonce = bytes(range(0x10, 0x20))
mac = bytes(range(0x40, 0x60))
write("tcp_wire_fuzz", "hello", tcp(1, w0=2, w1=6)[:24] + nonce + b"node-a")
write("tcp_wire_fuzz", "challenge", tcp(4)[:24] + nonce + mac)
write("tcp_wire_fuzz", "proof", tcp(5) + mac)
write("tcp_wire_fuzz", "write", tcp(2, w0=7, w1=4096, w2=0x10002, d0=8192, d1=42))
write("tcp_wire_fuzz", "ack", tcp(3, d1=42))
write("tcp_wire_fuzz", "ack_refused", tcp(3, w0=5, w1=1, d1=42))
write("tcp_wire_fuzz", "refuse", tcp(6, w0=1))
write("tcp_wire_fuzz", "refuse_unknown", tcp(6, w0=2))
write("tcp_wire_fuzz", "bad_magic", tcp(2, magic=0xEEEEEEEE))
write("tcp_wire_fuzz", "name", b"node-b")


# agent/fabric/verbs/wire.h: u32 magic, u16 version, u16 type, u32 word0..3,
# u64 dword0..2 (a HELLO's dword2: the port's u16 LID), 16-byte gid; a HELLO is
# followed by its name and QP records.
def verbs(type_, w=(0, 0, 0, 0), d=(0, 0, 0), gid=bytes(16)):
    return struct.pack("<IHHIIIIQQQ", 0x42564C46, 4, type_, *w, *d) + gid


gid = bytes(10) + b"\xff\xff" + bytes([127, 0, 1, 1])
qps = struct.pack("<IIII", 17, 0x123456, 18, 0x654321)
hello = verbs(1, w=(1, 2, 5, 6), gid=gid)
write("verbs_wire_fuzz", "hello", hello[:24] + nonce + hello[40:] + b"node-a" + qps)
# CHALLENGE: bytes 8..40 the MAC, 48..64 the server nonce; PROOF: the MAC alone.
write("verbs_wire_fuzz", "challenge", verbs(11)[:8] + mac + bytes(8) + nonce)
write("verbs_wire_fuzz", "proof", verbs(12)[:8] + mac + bytes(24))
write("verbs_wire_fuzz", "hello_reply", verbs(1, w=(1, 1, 3, 0), gid=gid) + qps[:8])
# An InfiniBand port's reply: dword2 carries its LID.
write("verbs_wire_fuzz", "hello_reply_ib", verbs(1, w=(1, 1, 5, 0), d=(0, 0, 0x1234), gid=gid) + qps[:8])
write("verbs_wire_fuzz", "refuse", verbs(2, w=(14, 0, 0, 0)))
write("verbs_wire_fuzz", "window_add", verbs(3, w=(7, 2, 0, 0), d=(0x1000, 0, 3))
      + struct.pack("<QQII", 0, 4096, 0x1234, 0) + struct.pack("<QQII", 8192, 4096, 0x1235, 0))
write("verbs_wire_fuzz", "window_remove", verbs(4, w=(7, 0, 0, 0), d=(0, 0, 4)))
write("verbs_wire_fuzz", "query", verbs(7, w=(7, 64, 0, 0), d=(4096, 0, 5)))
write("verbs_wire_fuzz", "verdict", verbs(8, w=(3, 0, 0, 0), d=(0, 0, 5)))
write("verbs_wire_fuzz", "qp_renew", verbs(9, w=(1, 17, 0x123456, 0), d=(0, 0, 6)))
write("verbs_wire_fuzz", "qp_renewed", verbs(10, w=(1, 18, 0x654321, 0), d=(0, 0, 6)))
write("verbs_wire_fuzz", "ready", verbs(5))
write("verbs_wire_fuzz", "ack", verbs(6, d=(0, 0, 4)))


# handle_protocol_fuzz: byte 0 data bytes, byte 1 bit 0 MSG_CTRUNC, the data, then
# control data: cmsghdr {u64 len, i32 level, i32 type} and the descriptors.
def rights(*fds):
    body = struct.pack("<%di" % len(fds), *fds)
    entry = struct.pack("<Qii", 16 + len(body), 1, 1) + body
    return entry + bytes(-len(entry) % 8)


write("handle_protocol_fuzz", "one_fd", b"\x01\x00F" + rights(5))
write("handle_protocol_fuzz", "cut", b"\x01\x01F" + rights(5))
write("handle_protocol_fuzz", "two_entries", b"\x01\x00F" + rights(5) + rights(6, 7))
write("handle_protocol_fuzz", "no_fd", b"\x01\x00G")
# The first 16 bytes read as a reply too: code 0 and a token, code 8.
write("handle_protocol_fuzz", "reply_ok", struct.pack("<IIQ", 0, 0, 0xfeedface))
write("handle_protocol_fuzz", "reply_refused", struct.pack("<IIQ", 8, 0, 0))


# request_checks_fuzz: byte 0 picks the message type (its index in kTypes), the rest
# is the message, written by hand (bad UTF-8 included).
def varint(v):
    out = b""
    while True:
        out += bytes([(v & 0x7F) | (0x80 if v > 0x7F else 0)])
        v >>= 7
        if not v:
            return out


def field(number, data):
    return varint(number << 3 | 2) + varint(len(data)) + data


def uint(number, v):
    return varint(number << 3) + varint(v)


block_set = lambda node, tensor, ids: field(1, node) + field(2, tensor) + field(3, b"".join(varint(i) for i in ids))
deadline = uint(1, 1_900_000_000) + uint(2, 5)
transfer = (field(1, b"req-17") + field(2, block_set(b"node-a", b"kv0", [0, 1, 2]))
            + field(3, block_set(b"node-b", b"kv0", [5, 6, 7]))
            + field(4, uint(1, 0) + uint(2, 32)) + field(5, deadline))
write("request_checks_fuzz", "transfer", b"\x00" + transfer)
write("request_checks_fuzz", "transfer_past_deadline",
      b"\x00" + field(1, b"r") + field(5, uint(1, (1 << 64) - 1)))
write("request_checks_fuzz", "transfer_bad_nanos",
      b"\x00" + field(1, b"r") + field(5, uint(1, 1_900_000_000) + uint(2, 1_000_000_000)))
host = field(1, uint(1, 12345) + uint(3, 4096))
write("request_checks_fuzz", "register", b"\x01" + field(1, b"kv0") + field(2, uint(1, 1) + uint(2, 4) + uint(3, 1024)) + field(3, host))
write("request_checks_fuzz", "get_bad_utf8", b"\x02" + field(1, b"kv\xc0\x80"))
write("request_checks_fuzz", "list", b"\x04" + uint(1, 10) + field(2, b"kv0"))
write("request_checks_fuzz", "unknown_group",
      b"\x07" + varint(9 << 3 | 3) + field(1, b"\xff") + varint(9 << 3 | 4) + field(1, b"kv"))


# web_config_fuzz: web-config files (services/metrics/http/web_config.h), good and refused.
HASH = b"$2b$10$fuselinkdummysaltfuseuVTKzBMwShV.zJPNIomO4LT9Qh81MSLy"
write("web_config_fuzz", "full", b"""# the metrics endpoint
tls_server_config:
  cert_file: server.crt   # relative
  key_file: "/etc/keys/server key.pem"
  client_ca_file: 'ca.crt'
  client_auth_type: RequireAndVerifyClientCert
  min_version: TLS13
basic_auth_users:
  prometheus: """ + HASH + b"\n  'other user': \"" + HASH + b"\"\n")
write("web_config_fuzz", "tls_only", b"tls_server_config:\n    cert_file: a\n    key_file: b\n")
write("web_config_fuzz", "users_only", b"basic_auth_users:\n  a: " + HASH + b"\r\n")
write("web_config_fuzz", "sequence", b"tls_server_config:\n  - cert_file: a\n")
write("web_config_fuzz", "flow", b"tls_server_config: {cert_file: a}\n")
write("web_config_fuzz", "bad_indent", b"a:\n    b: c\n  d: e\n")
write("web_config_fuzz", "escapes", b"a: \"x\\ty\\\"z\\\\\"\nb: 'it''s'\n")
write("web_config_fuzz", "deep", b"a:\n b:\n  c:\n   d:\n    e:\n     f:\n      g:\n       h: i\n")


# tests/fuzz/layout_fuzz.cc: u8 region count - 1, u32 sizes, then a fuselink.v1.Layout
# (protobuf: varint fields 1-6, BlockPart messages in field 7).
def varint(v):
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def field(number, value):
    return varint(number << 3) + varint(value)


def part(region, offset, size, stride=0):
    body = field(1, region) + field(2, offset) + field(3, stride) + field(4, size)
    return varint(7 << 3 | 2) + varint(len(body)) + body


def layout_input(sizes, layout):
    return bytes([len(sizes) - 1]) + b"".join(struct.pack("<I", s) for s in sizes) + layout


write("layout_fuzz", "strided", layout_input([4 * 8 * 64], field(1, 4) + field(2, 8) + field(3, 64)))
write("layout_fuzz", "vllm_per_layer",
      layout_input([2 * 8 * 32] * 3, field(1, 3) + field(2, 8) + field(6, 2) +
                   b"".join(part(r, o, 32) for r in range(3) for o in (0, 8 * 32))))
write("layout_fuzz", "sglang_pairs",
      layout_input([16 + 8 * 32] * 4, field(1, 2) + field(2, 8) + field(6, 2) +
                   b"".join(part(r, 16, 32) for r in range(4))))
write("layout_fuzz", "interleaved",
      layout_input([8 * 64], field(1, 1) + field(2, 8) + field(6, 2) +
                   part(0, 0, 32, 64) + part(0, 32, 32, 64)))
write("layout_fuzz", "overlapping",
      layout_input([8 * 64], field(1, 1) + field(2, 8) + field(6, 2) +
                   part(0, 0, 32, 64) + part(0, 16, 32, 64)))
