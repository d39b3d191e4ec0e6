# Postmesh developer commands. See README.md.
.PHONY: run test deps build key bench soak lint fmt image k8s-check api-check openapi fuzz

CARGO ?= cargo
DOCKER ?= docker
IMAGE_TAG ?= dev
# `make soak`: processes of each service, and NATS nodes (1 or 3; deploy/nats-cluster.sh).
REPLICAS ?= 1
NATS_CLUSTER ?= 1
SERVICES := api-gateway billing sender domain inbound-ingest webhook-dispatcher smtp-submission

run: ## start dependencies and every service (Ctrl-C stops)
	./deploy/run.sh

test: deps ## the whole suite against real PostgreSQL, Redis and NATS
	$(CARGO) build --workspace --bins # tests run the service binaries as child processes
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run --workspace --no-fail-fast; \
	else \
		$(CARGO) test --workspace --no-fail-fast; \
	fi

deps: ## start PostgreSQL, Redis and NATS unless already running (and install Chromium for the browser test)
	@WITH_BROWSER=1 ./deploy/deps.sh

build:
	$(CARGO) build --workspace

key: deps ## make key EMAIL=you@example.com CREDITS=100 [ROLE=admin] [MODE=test] (needs `make run` running)
	@test -n "$(EMAIL)" || { echo "usage: make key EMAIL=you@example.com CREDITS=100" >&2; exit 2; }
	@$(CARGO) run -q -p api-gateway -- create-key --email "$(EMAIL)" --credits "$(or $(CREDITS),0)" --role "$(or $(ROLE),member)" --mode "$(or $(MODE),live)"

bench: deps ## the stack against baselines (/balance, sending, inbound, webhooks); see docs/benchmarks.md
	$(CARGO) build -q --release -p api-gateway -p billing -p sender -p inbound-ingest -p webhook-dispatcher -p smtp-submission # run as their own processes
	RUST_LOG=warn $(CARGO) run -q --release -p postmesh-tests --bin bench

soak: deps ## under load, kill each service (each replica, REPLICAS=2) in turn and restart PostgreSQL, Redis and NATS (NATS_CLUSTER=3: its leaders); asserts nothing lost, nothing twice (docs/reliability.md)
	$(CARGO) build -q --workspace --bins # the services run as child processes
	REPLICAS=$(REPLICAS) NATS_CLUSTER=$(NATS_CLUSTER) $(CARGO) run -q -p postmesh-tests --bin soak

openapi: ## rewrite the request and answer schemas the gateway's /openapi.json includes, from the services' types, docs/api.md from the document, and the table of docs/configuration.md from the settings
	UPDATE_OPENAPI=1 $(CARGO) test -q -p postmesh-tests --test routes the_body_schemas_the_gateway_includes_are_current
	UPDATE_OPENAPI=1 $(CARGO) test -q -p postmesh-tests --test routes the_api_reference_in_docs_is_current
	UPDATE_OPENAPI=1 $(CARGO) test -q -p postmesh-tests --test routes the_configuration_table_in_docs_is_written_from_the_settings

fuzz: ## every parser of outside input under cargo-fuzz, FUZZ_SECS (60) each; FUZZ_TARGETS picks some (deploy/fuzz.sh)
	./deploy/fuzz.sh

lint: ## formatting and clippy, as CI checks them
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

image: ## postmesh/<service>:$(IMAGE_TAG) for the seven services from deploy/Dockerfile (needs a Docker daemon)
	@if ! command -v $(DOCKER) >/dev/null 2>&1 || ! $(DOCKER) info >/dev/null 2>&1; then \
		echo "make image: no Docker daemon answers here ('$(DOCKER) info' fails): build the images where Docker runs" >&2; \
		exit 1; \
	fi
	@for svc in $(SERVICES); do \
		echo "make image: postmesh/$$svc:$(IMAGE_TAG)" >&2; \
		DOCKER_BUILDKIT=1 $(DOCKER) build -f deploy/Dockerfile --build-arg SERVICE=$$svc \
			-t postmesh/$$svc:$(IMAGE_TAG) . || exit 1; \
	done

api-check: ## every operation of /openapi.json against a running stack with schemathesis (no 5xx, no answer the document does not allow)
	./deploy/api-check.sh

k8s-check: ## render k8s/overlays/dev and prod, validate every object (kubernetes-validate --strict)
	./deploy/k8s-check.sh
