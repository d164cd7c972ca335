// Package api holds the server types and routes generated from api/openapi.yaml.
package api

//go:generate go tool oapi-codegen -config cfg.yaml ../../api/openapi.yaml
