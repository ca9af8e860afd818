#!/usr/bin/env python3
"""Groups `perf script -F tid,ip,sym --no-inline` samples of tollgate into the parts of a proxied request.

Reads the perf script text on stdin; prints each part's share of all samples (inclusive), and how much
of that share was spent in the kernel (syscalls, loopback TCP) and in libc (malloc, free, memmove).
Used by bench/profile; the categories are substrings of Rust symbol names, first match wins.
"""

import sys
from collections import Counter

# (label, substrings: a sample belongs to the part if any frame contains one of them). Checked in order.
PROXY_PARTS = [
    ("proxy: upstream send (hyper_util Client: pool checkout, hand-off to the conn task, timeout)",
     ["tollgate::upstream::HttpClient as tollgate::upstream::UpstreamClient>::send"]),
    ("proxy: strip_hop_by_hop / strip_tollgate", ["tollgate::http::headers::strip_"]),
    ("proxy: gate reserve + store call (memory; or Redis: args, pool, hand-off, decode)",
     ["tollgate::gate::Gate::reserve", "tollgate::store::"]),
    ("proxy: ticket hold (sleep_until) and drop", ["tollgate::gate::Ticket"]),
    ("proxy: route + upstream_uri", ["tollgate::route::", "tollgate::http::proxy::upstream_uri"]),
    ("proxy: metrics", ["prometheus_client::", "tollgate::telemetry::"]),
    ("proxy: tracing", ["tracing::", "tracing_core::", "tracing_subscriber::"]),
    ("proxy: Holding guard", ["tollgate::http::proxy::Holding"]),
]

SERVER_PARTS = [
    ("server conn: drop request/response", ["core::ptr::drop_in_place<http::request", "drop_in_place<http::response",
                                            "drop_in_place<hyper::body"]),
    ("server conn: read + parse request", ["Dispatcher<D,Bs,I,T>::poll_read", "role::Server as hyper::proto::h1::Http1Transaction>::parse",
                                           "Buffered<T,B>::poll_read_from_io"]),
    ("server conn: encode + write response", ["Dispatcher<D,Bs,I,T>::poll_flush", "role::Server as hyper::proto::h1::Http1Transaction>::encode",
                                              "Dispatcher<D,Bs,I,T>::poll_write"]),
]


def frames_of(lines):
    """Yields (tid, [(addr, symbol), ...]) per sample, innermost frame first."""
    tid, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if tid is not None:
                yield tid, frames
            tid, frames = None, []
            continue
        if not line.startswith(("\t", " ")) or tid is None and line.strip().isdigit():
            tid, frames = line.strip(), []
            continue
        parts = line.strip().split(" ", 1)
        frames.append((parts[0], parts[1] if len(parts) > 1 else ""))
    if tid is not None:
        yield tid, frames


def classify(frames):
    syms = [s for _, s in frames]
    joined = "\n".join(syms)

    def has(subs):
        return any(s in joined for s in subs)

    if "tollgate::http::serve::{{closure}}::{{closure}}" in joined:
        if "tollgate::http::proxy::Proxy::proxy" in joined or "tollgate::http::proxy::Proxy::handle" in joined:
            for label, subs in PROXY_PARTS:
                if has(subs):
                    return label
            return "proxy: other (headers, URI, response parts)"
        for label, subs in SERVER_PARTS:
            if has(subs):
                return label
        return "server conn: other"
    if "tollgate::http::serve::{{closure}}" in joined and "accept" in joined:
        return "accept loop"
    if "redis::aio" in joined or "redis::" in joined and "tollgate::" not in joined:
        return "redis connection task (write script calls, read replies)"
    if "hyper::proto::h1::dispatch" in joined or "hyper::client::conn" in joined:
        return "upstream conn task (hyper client: write request, read response)"
    if has(["tokio::runtime::time", "tokio::time::"]):
        return "tokio timers"
    if has(["park", "Driver::turn", "epoll_wait", "poll::Poll::poll"]):
        return "tokio scheduler: park/unpark, IO driver"
    if has(["tokio::runtime::scheduler"]):
        return "tokio scheduler: other"
    return "other"


def where(frames):
    if not frames:
        return "user"
    addr, sym = frames[0]
    if addr.startswith("ffffffff"):
        return "kernel"
    if any(k in sym for k in ("malloc", "free", "memmove", "memcpy", "memset", "_int_", "unlink_chunk", "cfree")):
        return "libc"
    return "user"


def main():
    totals, kinds = Counter(), {}
    n = 0
    for _, frames in frames_of(sys.stdin):
        if not frames:
            continue
        n += 1
        label = classify(frames)
        totals[label] += 1
        kinds.setdefault(label, Counter())[where(frames)] += 1
    if not n:
        print("no samples")
        return
    print(f"{'part of the request path':<92} {'share':>6} {'kernel':>7} {'malloc/memmove':>15}")
    for label, count in totals.most_common():
        k = kinds[label]
        print(f"{label:<92} {100 * count / n:5.1f}% {100 * k['kernel'] / n:6.1f}% {100 * k['libc'] / n:14.1f}%")
    all_kinds = Counter()
    for k in kinds.values():
        all_kinds.update(k)
    print(f"{'all samples: ' + str(n):<92} {100.0:5.1f}% {100 * all_kinds['kernel'] / n:6.1f}% "
          f"{100 * all_kinds['libc'] / n:14.1f}%")


if __name__ == "__main__":
    main()
