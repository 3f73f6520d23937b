"""``autoloader show PLAN --html FILE``: the plan as one self-contained page to share.

No network: styles are inline, charts are PNG data URIs, and the page declares a
Content-Security-Policy that forbids fetching anything, so it opens the same from a
laptop, a ticket attachment or a cluster's web file browser.
"""

from __future__ import annotations

import base64
import html
from typing import Any

from autoloader.cli.cache_view import cache_settings
from autoloader.cli.plot import panel_pngs
from autoloader.cli.render import Section, baseline_section, render, sections, verdict
from autoloader.cli.text import printable
from autoloader.plan import Plan
from autoloader.plan.view import View
from autoloader.units import format_bytes

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.meta { color: #666; font-size: 0.9em; }
.verdict { border-left: 5px solid #2a7; background: #f3faf6; padding: 0.7em 1em;
           font-size: 1.05em; }
.verdict.memory-bound { border-color: #c33; background: #fdf3f3; }
.verdict.input-bound { border-color: #d80; background: #fff8ee; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.8em; text-align: left; }
th { background: #f6f6f6; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr));
          gap: 1em; }
figure { margin: 0; } figure img { width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #666; font-size: 0.9em; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
"""


def report_html(plan: Plan, *, path: str) -> str:
    """The page: verdict, baseline against plan, settings, charts, then every table."""
    e = html.escape
    spec = printable(View.of(plan.dataset).word("spec", str(plan.source)))
    meta = View.of(plan.meta)
    body = [
        f"<h1>autoloader plan: {e(spec)}</h1>",
        f'<p class="meta">{e(path)} &middot; created {e(meta.word("created"))} on '
        f"{e(meta.word('host'))} by autoloader "
        f"{e(meta.word('autoloader_version'))}<br><code>"
        f"{e(meta.word('command', ''))}</code></p>",
    ]
    found = verdict(plan)
    if found is not None:
        kind = View.of(plan.tuning).sub("baseline").word("diagnosis", "")
        body.append(f'<p class="verdict {e(kind)}" id="verdict">{e(found)}</p>')
    compared = baseline_section(plan)
    if compared is not None:
        body.append(_table(compared))
    body.append("<h2>settings</h2>" + _pairs(_settings(plan)))
    body.append('<h2>charts</h2><div class="charts">')
    for title, png in panel_pngs(plan):
        data = base64.b64encode(png).decode("ascii")
        body.append(
            f'<figure><img alt="{e(title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(title)}</figcaption></figure>"
        )
    body.append("</div>")
    body += [_table(s) for s in sections(plan)]
    body.append(
        f"<h2>the plan as <code>show</code> prints it</h2><pre>{e(render(plan, path=path))}</pre>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>autoloader plan: {e(spec)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _settings(plan: Plan) -> list[tuple[str, Any]]:
    lp, bp, mem = plan.loader, plan.batching, plan.memory
    out: list[tuple[str, Any]] = [(f"loader.{k}", v) for k, v in vars(lp).items() if v is not None]
    out += [(f"batching.{k}", v) for k, v in vars(bp).items() if k != "options"]
    out += [(f"batching.options.{k}", v) for k, v in bp.options.items()]
    out += [(f"memory.{k}", mem[k]) for k in ("budget_bytes", "predicted_peak_bytes") if k in mem]
    return out + cache_settings(plan)


def _pairs(pairs: list[tuple[str, Any]]) -> str:
    e = html.escape
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(_value(k, v))}</td></tr>" for k, v in pairs)
    return f"<table>{rows}</table>"


def _value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()  # as the plan's TOML writes it
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{format_bytes(value)} ({value:,} bytes)"
    return str(value)


def _table(section: Section) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in section.header)
    rows = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in section.rows
    )
    notes = "".join(f"<p>{e(n)}</p>" for n in section.notes)
    return f"<h2>{e(section.title)}</h2><table><tr>{head}</tr>{rows}</table>{notes}"
