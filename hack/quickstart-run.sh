#!/usr/bin/env bash
# Runs the tour of docs/quickstart.md for real and keeps every output in
# /tmp/qs/*.out, for pasting into the doc.
set -x
cd "$(dirname "$0")/.."
export QCP_STATE_DIR=/tmp/qs/state
rm -rf /tmp/qs; mkdir -p /tmp/qs
unset KUBECONFIG
( time make up ) > /tmp/qs/up.out 2>&1
bin/qcpctl describe cluster demo > /tmp/qs/describe1.out 2>&1
bin/qcpctl up > /tmp/qs/up-again.out 2>&1
bin/qcpctl kubeconfig demo -o /tmp/qs/demo.kubeconfig > /tmp/qs/kubeconfig.out 2>&1
bin/qcpctl describe cluster demo --watch --interval 500ms > /tmp/qs/watch-scale.out 2>&1 &
w=$!
bin/qcpctl scale demo --replicas 5 > /tmp/qs/scale.out 2>&1
for i in $(seq 1 300); do
  bin/qcpctl describe cluster demo -o json > /tmp/qs/j.json 2>/dev/null
  [ "$(python3 -c "import json;t=json.load(open('/tmp/qs/j.json'));cp=t['controlPlane'];print(cp['status']=='True' and sum(1 for m in cp['machines'] if m['etcdRole'] in ('leader','voter') and m.get('memberHealthy'))==5 and len(cp['machines'])==5)")" = True ] && break
  sleep 2
done
kill -INT $w; wait $w
bin/qcpctl describe cluster demo > /tmp/qs/describe5.out 2>&1
victim=$(python3 -c "import json;t=json.load(open('/tmp/qs/j.json'));print([m['name'] for m in t['controlPlane']['machines'] if m['etcdRole']=='voter'][0])")
bin/qcpctl describe cluster demo --watch --interval 500ms > /tmp/qs/watch-kill.out 2>&1 &
w=$!
date +%s > /tmp/qs/kill.start
bin/qcpctl machine kill $victim > /tmp/qs/kill.out 2>&1
for i in $(seq 1 300); do
  bin/qcpctl describe cluster demo -o json > /tmp/qs/j.json 2>/dev/null
  [ "$(python3 -c "import json;t=json.load(open('/tmp/qs/j.json'));cp=t['controlPlane'];print(cp['status']=='True' and '$victim' not in [m['name'] for m in cp['machines']] and sum(1 for m in cp['machines'] if m['etcdRole'] in ('leader','voter') and m.get('memberHealthy'))==5 and len(cp['machines'])==5)")" = True ] && break
  sleep 2
done
date +%s > /tmp/qs/kill.end
kill -INT $w; wait $w
bin/qcpctl describe cluster demo > /tmp/qs/describe-after-kill.out 2>&1
( time make down ) > /tmp/qs/down.out 2>&1
ls -la /tmp/qs/state > /tmp/qs/after-down.out 2>&1
echo DONE > /tmp/qs/done
