"""Every limit of the recording proxy, in one place (docs/security.md, "The recording proxy").

A client that hits one sees what the comment says; none of them needs the token to apply, so a
client that never authenticates cannot hold the proxy's sockets, memory or event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from trayapp.core.server_kinds import server_kind_row

# Framing (services/proxy/http1.py): larger → 400 (a request) or 502 (a response), then closed.
MAX_HEAD_BYTES = 64 * 1024  # a request or response head, and a chunked body's trailers
MAX_CHUNK_LINE_BYTES = 4096  # one chunk-size line with its extensions

# Time.
HEAD_TIMEOUT_S = 10.0  # a request head must arrive whole within this (from the connection, or
#                        from its first byte on a kept-alive one): else 408, then closed
IDLE_TIMEOUT_S = 60.0  # a kept-alive connection with no new request this long is closed (quietly)
BODY_STALL_TIMEOUT_S = 60.0  # a request body that sends nothing this long: closed, the upstream too
SEND_STALL_TIMEOUT_S = 300.0  # a client that reads nothing of its response this long: closed
CONNECT_TIMEOUT_S = 10.0  # connecting to the upstream: else 502
CLOSE_TIMEOUT_S = 1.0  # flushing a closing socket
UPSTREAM_REUSE_IDLE_S = 4.0  # an upstream connection idle longer is not reused: servers close idle
#                              keep-alive connections (llama-server's cpp-httplib and uvicorn after
#                              5 s), and one closing just as a request goes out answers nothing (the
#                              request is then sent once more on a new one: server._replay_after);
#                              under it, a client's next request within 4 s (an agent's tool call)
#                              goes up on the kept connection, not after a connect
EARLY_UPSTREAM_HOLD_S = 0.25  # a new client connection opens its upstream connection at once, while
#                               its first head arrives (listeners without a token only); unused this
#                               long (no head), it is closed, and opened again when a request comes


@dataclass(frozen=True)
class UpstreamReuse:
    """How a listener keeps and reuses its upstream connections, by the server's HTTP stack."""

    pool_most: int  # connections kept after their clients have gone (exchange.UpstreamPool): the next
    #                 client's request goes up on one at once, each closed after UPSTREAM_REUSE_IDLE_S
    max_answers: int  # answers one connection carries; then a new one is opened


# llama-server (cpp-httplib) holds one of its HTTP threads (at least n_parallel + 2 of them) for each
# open connection and closes one after its 5th request (keep_alive_max_count): two kept, four answers
# each. So for any server not known to be otherwise.
UPSTREAM_REUSE_THREADED = UpstreamReuse(pool_most=2, max_answers=4)
# A server on an event loop (server_kinds `idle_connections_free`: uvicorn, Go) holds nothing for an
# idle connection: 50 clients that connect per request (curl, scripts, SDKs without a session) at once
# have every request go up on a kept connection, none after a connect (issue #26: their median first
# token went from 3.1 ms later than straight to the server to 0.5 ms sooner).
UPSTREAM_REUSE_EVENT_LOOP = UpstreamReuse(pool_most=64, max_answers=1000)


def upstream_reuse(server_kind: str) -> UpstreamReuse:
    """How a listener in front of a server of `server_kind` keeps its upstream connections."""
    row = server_kind_row(server_kind)
    free = row is not None and row.idle_connections_free
    return UPSTREAM_REUSE_EVENT_LOOP if free else UPSTREAM_REUSE_THREADED


# Connections, per listener. The cap is also held under the process's file-descriptor limit
# (each proxied connection holds two descriptors; the rest is left to the monitor and the store).
MAX_CONNECTIONS = 512
FD_RESERVE = 64  # descriptors never used by the proxies' connections
ACCEPT_BACKLOG = 64  # the listen queue, and so the most sockets asyncio accepts in one burst before
#                      any connection is looked at: kept out of the cap's room as well. 32 overflowed
#                      when 50 clients connected at once beside a busy loop (Linux drops the SYN; the
#                      client retries 1 s later: +1 s at p99 in bench/proxy_overhead.py); 64 still
#                      leaves 16 connections a listener to two listeners under macOS's 256 descriptors
# At the cap the oldest connection waiting for a request head (idle or trickling) is closed to
# make room; when every connection is busy with a request, the new one gets 503 and is closed.

# Memory: request bodies the recorder reads (model, stream, max_tokens, the prompt's size).
REQUEST_BODY_KEPT_BYTES = 16 * 1024 * 1024  # one body: larger ones are forwarded, read for nothing
REQUEST_BODIES_HELD_BYTES = 64 * 1024 * 1024  # all bodies held at once, per listener: past it, a
#                                               new body is forwarded without being read
REPLAY_KEPT_BYTES = 1024 * 1024  # a request (head and body, as sent upstream) up to this size is kept
#                                  until its answer begins: when the upstream closes the connection
#                                  without a byte of answer, it is sent once more on a new connection
#                                  (a generation request is safe to send twice: it changes nothing)
PARSE_OFF_LOOP_BYTES = 256 * 1024  # a body larger than this is parsed on a worker thread (one at a
#                                    time), never on the event loop that forwards the streams

READ_BYTES = 64 * 1024  # one socket read

# The recorder's work beside a request: none of it stands between the request and its answer's first
# bytes. The client's name (clients.py: a pass over its sockets) is looked up once the answer's head
# has gone to the client (a stream's first text: 50 streams starting together were ~2 ms later to
# their first token when each lookup began 5 ms after its request), when the request ends, or this
# long after the request went up, whichever is first: while a server reads a long prompt the client
# is named (it may hang up before the answer begins), and a fast answer is never queued behind the
# lookup (issue #26).
NAME_CLIENT_AFTER_S = 0.25
# An answer's payloads before its first text (a role-only chunk, llama-server's progress) are read by
# the recorder this long after they came, not at once: the first token, which a server sends right
# behind a role-only chunk (llama-server writes both at once), is then forwarded first, not after
# ~0.1 ms of reading the chunk before it (issue #26). Their times are when they came.
FIRST_TEXT_LOOKAHEAD_S = 0.002

# The prompt counter (services/proxy/prompt_length.py): only a request body at least this large gets
# its prompt counted (two requests to the server beside it). A count serves a progress bar, and
# llama-server moves a slot's progress once per batch (`-b`, 2048 tokens by default), polled about
# once a second: a prompt within one batch goes from nothing read to all read in one step, so its
# total shows nothing. A body under 8 KiB holds a prompt under 8 KiB: ~2,000 tokens of English at
# ~4 bytes a token (one batch), at most ~4,000 of denser text (code, CJK: two batches).
COUNT_PROMPT_FROM_BYTES = 8 * 1024


def connection_budget(fd_soft_limit: int | None, listeners: int, pool_most: int) -> tuple[int, int]:
    """(connections one listener accepts at once, upstream connections it keeps for the next clients):
    MAX_CONNECTIONS and `pool_most`, or fewer, so that all listeners' connections (two descriptors
    each), one accept burst each and the kept ones stay under the descriptor limit less FD_RESERVE (the
    kept ones at most an eighth of what is left after the bursts)."""
    if fd_soft_limit is None or fd_soft_limit <= 0:
        return MAX_CONNECTIONS, pool_most
    count = max(1, listeners)
    room = fd_soft_limit - FD_RESERVE - ACCEPT_BACKLOG * count
    kept = max(0, min(pool_most, room // (8 * count)))
    return max(4, min(MAX_CONNECTIONS, (room - kept * count) // (2 * count))), kept
