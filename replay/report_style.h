// The CSS of the HTML diff report (replay/html_report.h): inline in the page, no fonts or other
// files. Internal to the report's files.
#pragma once

namespace retrace::replay::html {

constexpr const char* kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1d1d1f;
       margin: 24px; max-width: 1160px; }
h1 { font-size: 22px; margin: 0 0 12px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
figure { margin: 12px 0 20px; }
figcaption { font-weight: 600; margin-bottom: 2px; }
svg { font-size: 12px; font-family: inherit; display: block; max-width: 100%; height: auto; }
svg .plot { fill: #fcfcfd; stroke: none; }
svg .grid { stroke: #e6e6e6; stroke-width: 1; }
svg .axis { stroke: #555; stroke-width: 1; }
svg .lane { stroke: #eee; stroke-width: 1; }
svg .label { font-weight: 600; }
svg .zero { stroke: #999; stroke-width: 1; stroke-dasharray: 2,2; }
svg .note-svg { fill: #666; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f4f6; font-weight: 600; }
td.v { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px;
       word-break: break-all; max-width: 420px; }
td.num { text-align: right; font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
td.absent { color: #888; font-style: italic; }
tr.differs td { background: #fff4e5; }
.verdict-ok { color: #1a7f37; font-weight: 600; }
.verdict-bad { color: #c8102e; font-weight: 600; }
.note { color: #555; }
.swatch-a { color: #1f5fbf; font-weight: 600; }
.swatch-b { color: #e07b00; font-weight: 600; }
)";

}  // namespace retrace::replay::html
