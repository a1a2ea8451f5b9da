"""HTML of the dashboard's pages (pure functions of the data; everything escaped)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from html import escape
from urllib.parse import urlencode

from fsbus import MessageInfo

from ._snapshot import GroupRow, PurgeResult, Snapshot

__all__ = [
    "error_page",
    "message_page",
    "overview_page",
    "purge_confirm_page",
    "purge_done_page",
    "topic_page",
]

PAYLOAD_SHOWN = 64 * 1024
"""Bytes of a payload shown on its page."""

_CSS = """
:root { --fg:#1d2330; --muted:#667085; --line:#e4e7ec; --bg:#f7f8fa; --accent:#3b5bdb;
        --warn:#b54708; --danger:#c01048; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color:var(--fg); background:var(--bg); }
header { background:#1d2330; color:#fff; padding:10px 24px; display:flex; gap:24px;
         align-items:baseline; }
header h1 { font-size:18px; margin:0; }
header a { color:#c7d2fe; text-decoration:none; }
header .root { color:#98a2b3; font-family:ui-monospace, monospace; font-size:12px; }
main { padding:16px 24px 48px; max-width:1400px; }
h2 { font-size:16px; margin:28px 0 8px; }
.cards { display:flex; gap:12px; flex-wrap:wrap; }
.card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:10px 16px;
        min-width:140px; }
.card .n { font-size:24px; font-weight:600; }
.card .l { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
table { border-collapse:collapse; background:#fff; border:1px solid var(--line); width:100%; }
th, td { text-align:left; padding:6px 10px; border-bottom:1px solid var(--line);
         vertical-align:top; }
th { background:#f2f4f7; font-weight:600; font-size:12px; color:#344054; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
code, pre, .mono { font-family:ui-monospace, SFMono-Regular, Menlo, monospace; font-size:12px; }
pre { background:#fff; border:1px solid var(--line); padding:12px; overflow:auto;
      white-space:pre-wrap; word-break:break-all; }
.muted { color:var(--muted); }
.locked { color:var(--warn); font-weight:600; }
.empty { color:var(--muted); padding:12px; background:#fff; border:1px dashed var(--line); }
a { color:var(--accent); }
form.inline { display:inline; }
button, input[type=submit] { font:inherit; padding:4px 10px; border-radius:6px;
        border:1px solid var(--line); background:#fff; cursor:pointer; }
button.danger, input.danger { border-color:var(--danger); color:var(--danger); }
input[type=text], input[type=password] { font:inherit; padding:4px 8px; border:1px solid
        var(--line); border-radius:6px; min-width:260px; }
.note { background:#fffaeb; border:1px solid #fedf89; padding:8px 12px; border-radius:6px; }
.ok { background:#ecfdf3; border:1px solid #abefc6; padding:8px 12px; border-radius:6px; }
footer { color:var(--muted); font-size:12px; margin-top:32px; }
"""

_REFRESH_JS = """
(function () {
  var box = document.getElementById('autorefresh');
  function tick() {
    if (!box || !box.checked) { return; }
    fetch(window.location.href, {headers: {'Accept': 'text/html'}})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var doc = new DOMParser().parseFromString(html, 'text/html');
        var fresh = doc.getElementById('live');
        var live = document.getElementById('live');
        if (fresh && live) { live.innerHTML = fresh.innerHTML; }
      })
      .catch(function () {});
  }
  setInterval(tick, 3000);
})();
"""


def _page(title: str, root: str, body: str, *, refresh: bool = False) -> str:
    toggle = (
        '<label class="muted"><input type="checkbox" id="autorefresh" checked> '
        "refresh every 3 s</label>"
        if refresh
        else ""
    )
    script = f"<script>{_REFRESH_JS}</script>" if refresh else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · fsbus</title><style>{_CSS}</style></head><body>"
        '<header><h1><a href="/">fsbus</a></h1>'
        '<a href="/">Overview</a>'
        f'<span class="root" title="bus directory">{escape(root)}</span>'
        f'<span style="margin-left:auto">{toggle}</span></header>'
        f"<main>{body}</main>{script}</body></html>"
    )


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _rate(r: float | None) -> str:
    if r is None:
        return '<span class="muted">—</span>'
    return f"{r:.1f}/s" if r < 100 else f"{r:.0f}/s"


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return '<span class="muted">—</span>'
    s = max(0.0, now - t)
    if s < 60:
        return f"{s:.0f} s ago"
    if s < 3600:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def _until(t: float, now: float) -> str:
    s = t - now
    if s <= 0:
        return "expired"
    if s < 60:
        return f"in {s:.0f} s"
    if s < 3600:
        return f"in {s / 60:.0f} min"
    return f"in {s / 3600:.1f} h"


def _when(t: float | None) -> str:
    if t is None:
        return '<span class="muted">—</span>'
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _link(path: str, **query: str) -> str:
    return escape(f"{path}?{urlencode(query)}")


def _topic_link(topic: str) -> str:
    shown = escape(topic) if topic else '<span class="muted">(empty topic)</span>'
    return f'<a href="{_link("/topic", t=topic)}"><code>{shown}</code></a>'


def _card(n: str, label: str) -> str:
    return f'<div class="card"><div class="n">{n}</div><div class="l">{escape(label)}</div></div>'


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], *, empty: str) -> str:
    body = "".join("<tr>" + "".join(rows_cell for rows_cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<div class="empty">{escape(empty)}</div>'
    th = "".join(
        f'<th class="num">{escape(h[1:])}</th>' if h.startswith("#") else f"<th>{escape(h)}</th>"
        for h in head
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _td(text: str, *, num: bool = False) -> str:
    return f'<td class="num">{text}</td>' if num else f"<td>{text}</td>"


def overview_page(snap: Snapshot) -> str:
    """The main page: totals, topics, durable queues, work-queue locks, streams, buckets."""
    now = snap.taken_at
    window = (
        f"rates over the last {snap.rate_window:.0f} s"
        if snap.rate_window
        else "rates appear after the next refresh"
    )
    cards = "".join(
        [
            _card(str(snap.messages), "messages"),
            _card(str(snap.singles), "work-queue messages"),
            _card(str(len(snap.locked)), "locked now"),
            _card(_bytes(snap.size), "payload bytes"),
            _card(str(len(snap.topics)), "topics"),
            _card(str(len(snap.queues)), "queues"),
            _card(str(len(snap.streams)), "streams"),
        ]
    )
    topics = _table(
        ["Topic", "#Multi", "#Work queue", "#Locked", "#Bytes", "Oldest", "#In", "#Out", ""],
        (
            [
                _td(_topic_link(t.topic)),
                _td(str(t.multi), num=True),
                _td(str(t.single), num=True),
                _td(
                    f'<span class="locked">{t.locked}</span>' if t.locked else "0",
                    num=True,
                ),
                _td(_bytes(t.size), num=True),
                _td(_ago(t.oldest, now)),
                _td(_rate(t.rate_in), num=True),
                _td(_rate(t.rate_out), num=True),
                _td(f'<a href="{_link("/purge", pattern=t.topic)}">purge…</a>' if t.single else ""),
            ]
            for t in snap.topics
        ),
        empty="No messages on the bus.",
    )
    queues = _table(
        ["Queue", "Bindings", "#Depth", "#Consumers", "#In", "#Out"],
        (
            [
                _td(f"<code>{escape(q.name)}</code>"),
                _td(_bindings(q.bindings)),
                _td(str(q.depth), num=True),
                _td(str(q.consumers), num=True),
                _td(_rate(q.rate_in), num=True),
                _td(_rate(q.rate_out), num=True),
            ]
            for q in snap.queues
        ),
        empty="No durable queues. Declare one with: fsbus queue declare NAME PATTERN",
    )
    locked = _table(
        ["Topic", "Message", "Held by", "#Priority", "Published"],
        (
            [
                _td(_topic_link(r.info.topic)),
                _td(
                    f'<a href="{_link("/message", bucket=r.info.bucket, name=r.info.name)}">'
                    f'<span class="mono">{escape(_short(r.info.name))}</span></a>'
                ),
                _td(f'<span class="locked">{escape(r.owner)}</span>'),
                _td(str(r.info.priority), num=True),
                _td(_ago(r.info.published_at, now)),
            ]
            for r in snap.locked
        ),
        empty="No work-queue message is being handled right now.",
    )
    buckets = _table(
        ["Bucket", "#Messages", "#Bytes", "#In", "#Out"],
        (
            [
                _td(f"<code>{escape(b.bucket)}</code>"),
                _td(str(b.messages), num=True),
                _td(_bytes(b.size), num=True),
                _td(_rate(b.rate_in), num=True),
                _td(_rate(b.rate_out), num=True),
            ]
            for b in snap.buckets
        ),
        empty="Every bucket is empty.",
    )
    streams = _table(
        ["Stream", "#Start", "#End", "#Records", "#Bytes", "Segments", "Consumer groups (lag)"],
        (
            [
                _td(f"<code>{escape(s.name)}</code>"),
                _td(str(s.start_offset), num=True),
                _td(str(s.end_offset), num=True),
                _td(str(s.records), num=True),
                _td(_bytes(s.size), num=True),
                _td(_segments(s.segments) if s.error is None else escape(s.error)),
                _td(_groups(s.groups)),
            ]
            for s in snap.streams
        ),
        empty="No streams.",
    )
    purge_form = (
        '<form class="inline" method="get" action="/purge">'
        '<input type="text" name="pattern" placeholder="pattern, e.g. jobs.#" required> '
        '<input type="submit" class="danger" value="Purge work queue…"></form>'
    )
    body = (
        '<div id="live">'
        f'<div class="cards">{cards}</div>'
        f'<h2>Topics <span class="muted">({escape(window)})</span></h2>{topics}'
        f"<h2>Queues</h2>{queues}"
        f"<h2>Work queue: messages being handled</h2>{locked}"
        f"<h2>Streams</h2>{streams}"
        f"<h2>Buckets</h2><details><summary>{len(snap.buckets)} of the bus's buckets hold "
        f"messages or saw traffic</summary>{buckets}</details>"
        f"<footer>Snapshot taken {_when(now)}.</footer>"
        "</div>"
        f"<h2>Purge</h2><p>{purge_form}</p>"
    )
    return _page("Overview", snap.root, body, refresh=True)


def _short(name: str) -> str:
    return name if len(name) <= 48 else name[:20] + "…" + name[-24:]


def _bindings(bindings: Sequence[str]) -> str:
    if not bindings:
        return '<span class="muted">none</span>'
    return " ".join(f"<code>{escape(b)}</code>" for b in bindings)


def _segments(segments: Sequence[tuple[int, int, int]]) -> str:
    if not segments:
        return '<span class="muted">none</span>'
    items = "".join(
        f"<li><code>{base}</code>&ndash;<code>{end}</code> · {_bytes(size)}</li>"
        for base, end, size in segments
    )
    return (
        f"<details><summary>{len(segments)} segment{'s' if len(segments) != 1 else ''}"
        f"</summary><ul>{items}</ul></details>"
    )


def _groups(groups: Sequence[GroupRow]) -> str:
    if not groups:
        return '<span class="muted">none</span>'
    parts = []
    for g in groups:
        members = f"{len(g.members)} consumer{'s' if len(g.members) != 1 else ''}"
        parts.append(
            f"<code>{escape(g.name)}</code>: lag <b>{g.lag}</b> "
            f'<span class="muted">(committed {g.committed}, {g.partitions} partitions, '
            f"{members})</span>"
        )
    return "<br>".join(parts)


def topic_page(
    root: str,
    topic: str,
    infos: Sequence[MessageInfo],
    owners: dict[str, str],
    *,
    total: int | None = None,
) -> str:
    """The messages of one topic (``total``: how many there are, when not all are listed)."""
    now = time.time()
    rows = (
        [
            _td(
                f'<a href="{_link("/message", bucket=i.bucket, name=i.name)}">'
                f'<span class="mono">{escape(_short(i.name))}</span></a>'
            ),
            _td("work queue" if i.single else "multi"),
            _td(_bytes(i.size), num=True),
            _td(str(i.priority), num=True),
            _td(_ago(i.published_at, now)),
            _td(escape(i.host or "") or '<span class="muted">—</span>'),
            _td(_until(i.expires, now)),
            _td(
                f'<span class="locked">{escape(owners.get(i.path, "locked"))}</span>'
                if i.locked
                else ""
            ),
        ]
        for i in infos
    )
    table = _table(
        ["Message", "Kind", "#Size", "#Priority", "Published", "Host", "Expires", "Held by"],
        rows,
        empty="No messages on this topic now.",
    )
    purge = (
        f'<p><a href="{_link("/purge", pattern=topic)}">Purge the work-queue messages of this '
        "topic…</a></p>"
        if any(i.single for i in infos)
        else ""
    )
    shown = escape(topic) if topic else "(empty topic)"
    more = (
        f'<p class="muted">The first {len(infos)} of {total} messages are listed.</p>'
        if total is not None and total > len(infos)
        else ""
    )
    body = f'<div id="live"><h2>Topic <code>{shown}</code></h2>{table}{more}{purge}</div>'
    return _page(f"Topic {topic}", root, body, refresh=True)


def _held_by(owners: dict[str, str], info: MessageInfo) -> str:
    if not info.locked:
        return ""
    return f'<span class="locked">{escape(owners.get(info.path, "locked"))}</span>'


def message_page(
    root: str, info: MessageInfo, payload: bytes | str | None, owner: str | None
) -> str:
    """One message: its properties, headers and payload (``str``: why it is not shown)."""
    now = time.time()
    props = [
        ("Topic", _topic_link(info.topic)),
        ("Kind", "work queue (single)" if info.single else "multi"),
        ("Size", f"{info.size} bytes"),
        ("Priority", str(info.priority)),
        ("Published", f"{_when(info.published_at)} ({_ago(info.published_at, now)})"),
        ("Host", escape(info.host or "—")),
        ("Expires", f"{_when(info.expires)} ({_until(info.expires, now)})"),
        ("Bucket", f"<code>{escape(info.bucket)}</code>"),
        ("File", f'<span class="mono">{escape(info.path)}</span>'),
    ]
    if info.single:
        props.append(("Held by", escape(owner or "locked") if info.locked else "nobody"))
    props_html = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in props)
    headers = _table(
        ["Header", "Value"],
        ([_td(f"<code>{escape(k)}</code>"), _td(escape(v))] for k, v in info.headers.items()),
        empty="No headers.",
    )
    body = (
        f'<h2>Message <span class="mono">{escape(info.name)}</span></h2>'
        f"<table>{props_html}</table><h2>Headers</h2>{headers}"
        f"<h2>Payload</h2>{_payload(payload)}"
    )
    return _page("Message", root, body)


def _payload(payload: bytes | str | None) -> str:
    if payload is None:
        return '<div class="empty">The message is gone (consumed or expired).</div>'
    if isinstance(payload, str):
        return f'<div class="empty">Not shown: {escape(payload)}.</div>'
    shown = payload[:PAYLOAD_SHOWN]
    more = (
        f'<p class="muted">First {PAYLOAD_SHOWN} of {len(payload)} bytes shown.</p>'
        if len(payload) > PAYLOAD_SHOWN
        else ""
    )
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        return f'<p class="muted">Binary; hex dump:</p><pre>{escape(_hexdump(shown))}</pre>{more}'
    if not text:
        return '<div class="empty">Empty payload.</div>'
    return f"<pre>{escape(text)}</pre>{more}"


def _hexdump(data: bytes) -> str:
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off : off + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)


def purge_confirm_page(root: str, preview: PurgeResult, token: str | None) -> str:
    """Ask before purging; the form carries the access token."""
    pattern = escape(preview.pattern)
    if preview.purged == 0:
        what = (
            f"<p>No waiting work-queue message matches <code>{pattern}</code>; "
            "nothing to purge.</p>"
        )
    else:
        what = (
            f'<p class="note">This will consume and delete <b>{preview.purged}</b> waiting '
            f"work-queue message{'s' if preview.purged != 1 else ''} matching "
            f"<code>{pattern}</code>. This cannot be undone.</p>"
        )
    extra = []
    if preview.locked:
        extra.append(f"{preview.locked} being handled by a consumer will be left alone")
    if preview.multi:
        extra.append(f"{preview.multi} multi message(s) are not purged: they expire at their TTL")
    notes = f'<p class="muted">{escape("; ".join(extra))}.</p>' if extra else ""
    token_field = (
        f'<input type="hidden" name="token" value="{escape(token)}">'
        if token
        else "<p><label>Access token (printed by <code>fsbus ui</code> at start): "
        '<input type="password" name="token" required autocomplete="off"></label></p>'
    )
    form = (
        '<form method="post" action="/purge">'
        f'<input type="hidden" name="pattern" value="{pattern}">{token_field}'
        f'<p><label>Type the pattern to confirm: <input type="text" name="confirm" required '
        f'autocomplete="off" placeholder="{pattern}"></label></p>'
        '<p><input type="submit" class="danger" value="Purge"> <a href="/">Cancel</a></p></form>'
        if preview.purged
        else '<p><a href="/">Back</a></p>'
    )
    body = f"<h2>Purge <code>{pattern}</code></h2>{what}{notes}{form}"
    return _page("Purge", root, body)


def purge_done_page(root: str, result: PurgeResult) -> str:
    """What a purge did."""
    skipped = f"; {result.locked} left because a consumer held them" if result.locked else ""
    body = (
        f'<h2>Purged <code>{escape(result.pattern)}</code></h2><p class="ok">'
        f"{result.purged} work-queue message{'s' if result.purged != 1 else ''} "
        f'consumed and deleted{escape(skipped)}.</p><p><a href="/">Back to the overview</a></p>'
    )
    return _page("Purged", root, body)


def error_page(root: str, title: str, message: str) -> str:
    """An error the user can act on."""
    body = (
        f'<h2>{escape(title)}</h2><p class="note">{escape(message)}</p><p><a href="/">Back</a></p>'
    )
    return _page(title, root, body)
