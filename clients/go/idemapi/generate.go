// Package idemapi is the low-level idemd client generated from api/openapi.yaml: one
// method per operation and the wire types. Most programs use package idem instead.
package idemapi

//go:generate go tool oapi-codegen -config cfg.yaml ../../../api/openapi.yaml
