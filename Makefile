# QCP — see README.md. Every binary is built from the Go module proxy.
SHELL := /usr/bin/env bash -o pipefail

ETCD_VERSION ?= v3.6.16
KUBE_VERSION ?= v1.36.3
# The version the upgrade scenario starts from; only `make test` builds it.
KUBE_PREVIOUS_VERSION ?= v1.35.4
# The etcd version the EtcdCluster upgrade starts from; only `make test` builds it.
ETCD_PREVIOUS_VERSION ?= v3.5.35
CAPI_VERSION ?= v1.14.2
CONTROLLER_TOOLS_VERSION ?= v0.21.0
# versitygw: the S3-compatible object store backups go to in the local
# environment and the tests (Apache-2.0, a posix directory behind S3).
VERSITYGW_VERSION ?= v1.8.0

BIN := $(CURDIR)/bin
ETCD := $(BIN)/etcd-$(ETCD_VERSION)
KUBE := $(BIN)/kube-$(KUBE_VERSION)
KUBE_PREVIOUS := $(BIN)/kube-$(KUBE_PREVIOUS_VERSION)
ETCD_PREVIOUS := $(BIN)/etcd-$(ETCD_PREVIOUS_VERSION)
CAPI := $(BIN)/capi-manager-$(CAPI_VERSION)
CABPK := $(BIN)/cabpk-manager-$(CAPI_VERSION)
CLUSTERCTL := $(BIN)/clusterctl-$(CAPI_VERSION)
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
VERSITYGW := $(BIN)/versitygw-$(VERSITYGW_VERSION)

# -count=1: CI must run every test, never report a cached result.
# Tests run packages in parallel; 2 keeps the heavy process tests within the
# memory and CPU of a 2-core machine.
TEST_PARALLEL ?= 2
# test/e2e runs at most this many scenarios at a time (QCP_E2E_SCENARIOS):
# most of a scenario's time is spent waiting on timers and health checks, and
# four scenarios' machines (about 600 MB each) fit in 24 GiB beside the other
# packages. Beyond the first, a scenario starts only while the host's CPUs
# are less than 75 % busy: on a host 1.7 to 2.5 times slower, four at once
# starved every scenario past its deadlines. The other packages keep go test's default (2 on 2 cores): run
# four at a time beside test/e2e, test/engine's five-member clusters starved
# their own members. See docs/testing.md for the budget.
TEST_SCENARIOS ?= 4
# The longest package, test/e2e (17 scenarios), took 2,407 s in CI and
# 3,136 s on a slower VM of the same kind when it ran two scenarios at a
# time, and 944 s at four (docs/measurements.md); 80m leaves it room under
# CI's 90-minute limit.
TEST_TIMEOUT ?= 80m
# Every Go process the tests start (test binaries, qcp-manager, agents, etcd,
# kube-apiserver, CAPI core: some 40 at once) inherits GOMAXPROCS. At Go's
# default, one per core, each runs its garbage collector and idle scheduler
# threads on both cores; at 1 the same tests used 14 to 19 % fewer CPU-seconds
# and 6 to 9 % less wall time (docs/measurements.md). It is set for go test
# only: the builds, and `make up`, keep the default.
TEST_GOMAXPROCS ?= 1
# The same processes inherit GOGC. At 400 each collects garbage a quarter as
# often as at Go's default (100): one machine's start took 1.8 to 1.9
# CPU-seconds against 2.2 to 2.5, for 775 MB of memory against 606. Over the
# whole suite the saving was within the noise between two runs; its peak
# memory in use was 13.5 GiB of 24 (11.2 at 200; bin/profile.md). Lower it
# if more scenarios at once need the memory. docs/measurements.md, stop 72.
# Only the test processes: the builds and `make up` keep Go's.
TEST_GOGC ?= 400
TEST_FLAGS ?=

export QCP_BIN_DIR := $(BIN)

# Every go command of the targets builds the same way as `make image`'s
# static qcp-manager (no cgo, -trimpath): hack/image's TestImage then links
# from packages the builds before it compiled, instead of compiling every
# dependency a second time during the test phase (about 200 CPU-seconds;
# docs/measurements.md). Nothing QCP or the pinned binaries build needs cgo.
export CGO_ENABLED ?= 0
export GOFLAGS := -trimpath $(GOFLAGS)

.PHONY: all binaries qcp-binaries generate verify-generate test test-steps test-profile unit bench chaos partitions lint up down clean check-strays image release cloud-init

all: binaries

## binaries: the pinned etcd, kube, CAPI core, CABPK and versitygw binaries (built once), plus QCP's own.
binaries: $(ETCD) $(KUBE) $(CAPI) $(CABPK) $(CLUSTERCTL) $(CONTROLLER_GEN) $(VERSITYGW) qcp-binaries

ETCD_WRAPPER := hack/tools/etcd/main.go hack/tools/etcd/go.mod
$(ETCD): $(ETCD_WRAPPER)
	hack/build-pinned.sh etcd $(ETCD_VERSION) $@
# A changed wrapper (a new command in the multi-call binary) rebuilds.
KUBE_WRAPPER := hack/tools/kube/main.go hack/tools/kube/go.mod
CAPI_WRAPPER := hack/tools/capi/main.go hack/tools/capi/go.mod
$(KUBE): $(KUBE_WRAPPER)
	hack/build-pinned.sh kube $(KUBE_VERSION) $@
$(KUBE_PREVIOUS): $(KUBE_WRAPPER)
	hack/build-pinned.sh kube $(KUBE_PREVIOUS_VERSION) $@
$(ETCD_PREVIOUS): $(ETCD_WRAPPER)
	hack/build-pinned.sh etcd $(ETCD_PREVIOUS_VERSION) $@
$(CAPI): $(CAPI_WRAPPER)
	hack/build-pinned.sh capi $(CAPI_VERSION) $@
$(CABPK): $(CAPI_WRAPPER)
	hack/build-pinned.sh cabpk $(CAPI_VERSION) $@
$(CLUSTERCTL): $(CAPI_WRAPPER)
	hack/build-pinned.sh clusterctl $(CAPI_VERSION) $@
$(CONTROLLER_GEN):
	@echo ">> building controller-gen $(CONTROLLER_TOOLS_VERSION)"
	GOBIN=$(BIN)/.controller-gen go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(BIN)/.controller-gen/controller-gen $@ && rmdir $(BIN)/.controller-gen

$(VERSITYGW):
	@echo ">> building versitygw $(VERSITYGW_VERSION)"
	GOBIN=$(BIN)/.versitygw go install -ldflags "-s -w" github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)
	mv $(BIN)/.versitygw/versitygw $@ && rmdir $(BIN)/.versitygw

# go build relinks only when a source changed, so this stays fast.
qcp-binaries:
	go build -o $(BIN)/ ./cmd/...

## generate: deepcopy, CRDs, RBAC and webhook manifests from the API types and markers.
generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd webhook paths=./api/... paths=./internal/webhooks/... \
		output:crd:artifacts:config=config/crd/bases output:webhook:artifacts:config=config/webhook
	@# One role per provider, from its own controllers' markers: the release
	@# installs the control plane provider and the process provider apart.
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths=./internal/controllers/controlplane/... \
		paths=./internal/controllers/etcdcluster/... paths=./internal/webhooks/... output:rbac:artifacts:config=config/rbac/controlplane
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths=./internal/controllers/process/... output:rbac:artifacts:config=config/rbac/process
	@# CAPI core's CRDs and webhook manifests, copied from the pinned module so
	@# that qcpctl and the tests carry them without a Go toolchain.
	rm -rf config/capi && mkdir -p config/capi/crd
	capi=$$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api) && \
		cp $$capi/core/config/crd/bases/*.yaml config/capi/crd/ && \
		cp $$capi/core/config/webhook/manifests.yaml config/capi/webhook-manifests.yaml && \
		cp $$capi/bootstrap/kubeadm/config/crd/bases/*.yaml config/capi/crd/ && \
		cp $$capi/bootstrap/kubeadm/config/webhook/manifests.yaml config/capi/cabpk-webhook-manifests.yaml && \
		chmod -R u+w config/capi
	@# CABPK's contract labels, as its kustomization adds them: CAPI core
	@# reads a bootstrap template's contract version from its CRD.
	sed -i '0,/^metadata:$$/s//metadata:\n  labels:\n    cluster.x-k8s.io\/v1beta1: v1beta1\n    cluster.x-k8s.io\/v1beta2: v1beta2/' \
		config/capi/crd/bootstrap.cluster.x-k8s.io_*.yaml

verify-generate: generate
	@git diff --exit-code -- api config || { echo "generated files are stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api config)" || { git status --porcelain -- api config; echo "untracked generated files: run 'make generate' and commit"; exit 1; }

## test: everything CI runs: generated files up to date, vet, all tests, no stray process.
# The whole run is recorded (hack/testprofile: CPU by package, scenario and
# component, once a second) into bin/profile.jsonl; its report, a timeline
# of builds and tests, is bin/profile.md. `make test-profile` prints it.
test:
	@mkdir -p $(BIN) && go build -o $(BIN)/testprofile ./hack/testprofile
	@status=0; $(BIN)/testprofile record -o $(BIN)/profile.jsonl -- $(MAKE) --no-print-directory test-steps || status=$$?; \
	$(BIN)/testprofile report -profile $(BIN)/profile.jsonl -tests $(BIN)/test.json -test-start $(BIN)/test-start > $(BIN)/profile.md && \
		echo ">> where the time went: bin/profile.md (make test-profile)"; \
	exit $$status

## test-profile: the timeline of the last `make test`: phases, packages, scenarios, CPU by component.
test-profile:
	@go build -o $(BIN)/testprofile ./hack/testprofile
	@$(BIN)/testprofile report -profile $(BIN)/profile.jsonl -tests $(BIN)/test.json -test-start $(BIN)/test-start

# QCP_REQUIRE_BINARIES turns a test's skip for a missing pinned binary into a
# failure. QCP_FRESH_BIN_DIR hands the tests the qcp-* binaries just built
# (qcp-binaries), so they link none of their own. QCP_TEST_RUN marks every
# process the tests start (children inherit it), so the stray check finds
# them wherever their binary was built; it runs, and reports, whether the
# tests passed or not. The report ends with the
# skipped tests, which plain `go test` does not show.
# The packages are listed longest first: go test starts them in that order,
# so test/e2e, the longest by far, starts at once instead of after the
# others, and the short ones fill the end. test/engine waits until the
# scenarios' first machines are up: its five-member clusters beside them
# starved both.
# The kube version upgrades start from (KUBE_PREVIOUS) is built beside the
# tests, at the lowest CPU priority (hack/build-beside.sh), not before
# them: only three scenarios need it, and they wait for it in the scenario
# queue while the others run. Built before, it was a quarter of a cold
# build's time, on a host the test phase leaves a quarter idle.
TEST_PACKAGES ?= ./test/e2e ./internal/controllers/process ./internal/cli ./internal/machinehost ./test/engine ./...
test-steps: binaries $(ETCD_PREVIOUS) verify-generate cloud-init
	go vet ./...
	@hack/inotify-limit.sh
	@go build -o $(BIN)/testreport ./hack/testreport
	@# Every test binary compiled (and run by true, which runs nothing)
	@# before the test phase, with both cores: on a cold build cache the
	@# compiles otherwise overlap the first scenarios' machines.
	go test -count=1 -exec true $(TEST_FLAGS) $(TEST_PACKAGES) > /dev/null
	@run=qcp-test-$$$$-$$(date +%s); status=0; date +%s%3N > $(BIN)/test-start; \
	hack/build-beside.sh $(KUBE_PREVIOUS) $(MAKE) --no-print-directory $(KUBE_PREVIOUS) & beside=$$!; \
	QCP_REQUIRE_BINARIES=1 QCP_FRESH_BIN_DIR=$(BIN) QCP_TEST_RUN=$$run QCP_E2E_SCENARIOS=$(TEST_SCENARIOS) GOMAXPROCS=$(TEST_GOMAXPROCS) GOGC=$(TEST_GOGC) go test -json -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) $(TEST_PACKAGES) 2>&1 \
		| tee $(BIN)/test.json | $(BIN)/testreport | tee $(BIN)/test.log || status=1; \
	wait $$beside || status=1; \
	hack/check-strays.sh $(BIN) $$run || status=1; \
	exit $$status

## cloud-init: Debian's cloud-init, installed when missing: internal/cloudinit
## checks QCP's bootstrap data with its `cloud-init schema`. apt is tried
## three times, as a mirror can fail once.
cloud-init:
	@command -v cloud-init >/dev/null || for try in 1 2 3; do \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cloud-init >/dev/null && break; \
		[ $$try = 3 ] && { echo "installing cloud-init failed: run apt-get install cloud-init"; exit 1; }; sleep 10; \
	done

## unit: the fast tests only (-short): they start no etcd, API server, CAPI
## core, machine or load balancer, and need no pinned binary.
unit:
	go test -short ./...

## bench: benchmarks, as JSON (go test -json) in bin/bench.json.
bench: binaries
	go test -run '^$$' -bench . -benchtime 1x -timeout 60m -json ./... | tee $(BIN)/bench.json | go run ./hack/benchjson

## chaos: the fault campaign (issue 13; make test runs a 3-seed smoke): the regression seeds,
## then RUNS runs from a seed of the clock's; with SEED, RUNS runs from SEED
## only (a replay). WORKERS runs that many side by side, each on a management
## cluster of its own. FOR (a duration, say 90m) starts no run once it has
## passed. One JSON line each in bin/chaos.jsonl; a campaign run
## in parts is summed up by `go run ./hack/chaossummary < bin/chaos.jsonl`.
RUNS ?= 3
SEED ?=
WORKERS ?= 1
FOR ?=
chaos: binaries
	QCP_CHAOS_RUNS=$(RUNS) QCP_CHAOS_SEED=$(SEED) QCP_CHAOS_WORKERS=$(WORKERS) QCP_CHAOS_FOR=$(FOR) go test -tags chaos -count=1 -v -parallel $(WORKERS) -run '^TestChaos$$' -timeout 0 ./test/e2e/

## partitions: the partition scenarios (issue 37), each machine a network host of its own; needs root.
partitions: binaries qcp-binaries
	QCP_BIN_DIR=$(BIN) QCP_REQUIRE_BINARIES=1 QCP_FRESH_BIN_DIR=$(BIN) go test -count=1 -v -run '^TestPartitioned' -timeout 30m ./test/e2e/

lint:
	gofmt -l . | tee /dev/stderr | (! read)
	go vet ./...

check-strays:
	hack/check-strays.sh $(BIN)

## up: a local management cluster (etcd, kube-apiserver; CAPI core, CABPK, QCP and the process provider installed by
## clusterctl init from the release in out/, their managers run as host processes) in the background, and the
## sample 3-machine cluster demo.
up: binaries release
	@hack/inotify-limit.sh
	$(BIN)/qcpctl up

down:
	$(BIN)/qcpctl down

# The version release artifacts carry.
VERSION ?= v0.1.0
OUT := $(CURDIR)/out

## image: qcp-manager's OCI image, qcp-manager:$(VERSION), as an OCI image layout in out/image, built
## from a static binary without a container engine (hack/image; the test is hack/image's TestImage).
image:
	@mkdir -p $(OUT)
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/qcp-dev/qcp/internal/version.Version=$(VERSION)" \
		-o $(OUT)/qcp-manager-static ./cmd/qcp-manager
	go run ./hack/image -binary $(OUT)/qcp-manager-static -out $(OUT)/image -version $(VERSION)

## release: the clusterctl provider repository in $(OUT): control-plane-qcp, infrastructure-process and
## CAPI core's cluster-api, each <label>/<version>/ with its components and metadata, and clusterctl.yaml
## naming them (hack/release; its test is internal/release's TestRelease).
release:
	go run ./hack/release -out $(OUT) -version $(VERSION)

clean:
	rm -rf $(BIN)
