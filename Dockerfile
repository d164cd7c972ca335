# syntax=docker/dockerfile:1
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY clients/go/go.mod clients/go/go.sum ./clients/go/
RUN GOWORK=off go mod download
COPY . .
# Release builds stamp what `idemd --version` and idemd_build_info report:
#   docker build --build-arg VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse HEAD) .
ARG VERSION=""
ARG COMMIT=""
RUN CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/idemd ./cmd/idemd \
 && CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/idemctl ./cmd/idemctl \
 && mkdir /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/idemd /idemd
# The operator's command, for kubectl exec: /idemctl lookup KEY.
COPY --from=build /out/idemctl /idemctl
# The embedded store's directory, writable by the non-root user; mount a volume here.
COPY --from=build --chown=nonroot:nonroot /out/data /data
VOLUME /data
USER nonroot:nonroot
EXPOSE 8080
# distroless has no shell or curl: the binary checks its own /healthz.
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD ["/idemd", "healthcheck", "--url", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/idemd"]
# With --store redis://... the data directory is unused.
CMD ["--data-dir", "/data"]
