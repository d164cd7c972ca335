// Package lua holds the Redis scripts, one file per transition, and the prelude they
// share.
package lua

import "embed"

// Scripts holds every .lua file of this directory.
//
//go:embed *.lua
var Scripts embed.FS
