#!/usr/bin/env bash
# Renders an HTML page (report.html) to a PNG with headless Chromium: a fresh throw-away profile,
# no GPU, no network services, killed after 60 s. Used by tests/report/test_html_report.cpp and handy
# for looking at a report without a browser window.
#   usage: scripts/render-report.sh PAGE.html OUT.png [WIDTH,HEIGHT]   (default 1200,1600)
# CHROMIUM=/path/to/chromium overrides the browser. Exits non-zero when no PNG was written.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 PAGE.html OUT.png [WIDTH,HEIGHT]" >&2
    exit 2
fi
page=$(realpath "$1")
png=$(realpath -m "$2")
size=${3:-1200,1600}
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$chromium" ]; then
    echo "render-report.sh: chromium not found (apt-get install chromium)" >&2
    exit 3
fi
profile=$(mktemp -d "${TMPDIR:-/tmp}/memfit-chromium.XXXXXX")
trap 'rm -rf "$profile"' EXIT
rm -f "$png"
# Chromium may return non-zero for harmless reasons (D-Bus, crash reporter); the PNG decides.
timeout 60 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
    --user-data-dir="$profile" --screenshot="$png" --window-size="$size" "file://$page" \
    >"$profile/chromium.log" 2>&1 || true
if [ ! -s "$png" ]; then
    echo "render-report.sh: chromium wrote no screenshot; its output:" >&2
    tail -n 20 "$profile/chromium.log" >&2
    exit 1
fi
