package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// tracing sets up OpenTelemetry tracing from the standard OTEL_* variables, and is off
// unless they ask for it: OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). Spans go over
// OTLP/HTTP with protobuf; the exporter reads its endpoint, headers, certificates,
// compression and timeout from the variables, and the SDK its sampler
// (OTEL_TRACES_SAMPLER) and batching (OTEL_BSP_*). OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES name the service, "idemd" by default.
//
// It returns nil when tracing is off, and a provider to hand to the server otherwise,
// whose Shutdown flushes the spans not yet sent.
func tracing(ctx context.Context) (*sdktrace.TracerProvider, error) {
	getenv := os.Getenv
	if getenv("OTEL_SDK_DISABLED") == "true" {
		return nil, nil
	}
	switch exporter := getenv("OTEL_TRACES_EXPORTER"); exporter {
	case "none":
		return nil, nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: idemd exports traces with otlp only (or none)", exporter)
	}
	name := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if getenv(name) == "" {
		name = "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	if p := getenv(name); p != "" && p != "http/protobuf" {
		return nil, fmt.Errorf("%s=%q: idemd sends OTLP over http/protobuf only", name, p)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	b := buildOf()
	// Later sources win: the defaults, then what the variables say.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("idemd"), semconv.ServiceVersion(b.Version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
