// Package api holds idemd's contract, openapi.yaml, for the daemon to serve as it is.
// The server and the clients are generated from the same file.
package api

import _ "embed"

// OpenAPI is the contract, byte for byte.
//
//go:embed openapi.yaml
var OpenAPI []byte
