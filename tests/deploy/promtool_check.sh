#!/usr/bin/env bash
# deploy/prometheus through Prometheus's own promtool: both scrape configs (with the rule file
# they load), the rules on their own, and the rules' unit tests (tests/deploy/prometheus).
#   tests/deploy/promtool_check.sh            # PROMTOOL overrides the promtool path
set -euo pipefail
cd "$(dirname "$0")/../.."
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
[ -n "$PROMTOOL" ] || { echo "promtool not found (Debian package prometheus)" >&2; exit 1; }

"$PROMTOOL" check config deploy/prometheus/prometheus.yml
"$PROMTOOL" check config deploy/prometheus/prometheus-static.yml
"$PROMTOOL" check rules deploy/prometheus/alerts.yml
"$PROMTOOL" test rules tests/deploy/prometheus/alerts_test.yml

# The unit tests must be able to fail: a rule file whose AttndDown never fires is caught.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/deploy/prometheus" "$tmp/tests/deploy/prometheus"
sed 's/expr: up{job="attnd"} == 0/expr: up{job="attnd"} == 2/' deploy/prometheus/alerts.yml \
  > "$tmp/deploy/prometheus/alerts.yml"
cp tests/deploy/prometheus/alerts_test.yml "$tmp/tests/deploy/prometheus/"
if "$PROMTOOL" test rules "$tmp/tests/deploy/prometheus/alerts_test.yml" > "$tmp/out" 2>&1; then
  echo "promtool test rules passed a broken AttndDown rule" >&2
  exit 1
fi
grep -q "alertname: AttndDown" "$tmp/out"
echo "promtool: configs, rules and rule tests ok (and a broken rule is caught)"
