// Package lua holds the Redis scripts, one file per transition, and the prelude they
// share.
package lua

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed *.lua
var files embed.FS

// Layout is how the scripts write a record; they read either.
type Layout int

const (
	// StringRecords writes each record as one string, the layout of this release.
	StringRecords Layout = iota
	// HashRecords writes each record as a hash, the layout of earlier releases, which
	// cannot read a string. Daemons of both releases can then share a Redis during a
	// rolling upgrade.
	HashRecords
)

// Source returns the script of a transition ("claim", "complete", ...) as Redis runs it,
// writing records in layout: the shared prelude followed by the transition's own file.
// A "#!lua flags=..." line stays first, where Redis looks for it.
func Source(transition string, layout Layout) (string, error) {
	prelude, err := files.ReadFile("prelude.lua")
	if err != nil {
		return "", err
	}
	body, err := files.ReadFile(transition + ".lua")
	if err != nil {
		return "", fmt.Errorf("no script for transition %q", transition)
	}
	src, shebang := string(body), ""
	if strings.HasPrefix(src, "#!") {
		nl := strings.IndexByte(src, '\n')
		shebang, src = src[:nl+1], src[nl+1:]
	}
	return fmt.Sprintf("%slocal HASH_RECORDS = %t\n%s\n%s", shebang, layout == HashRecords, prelude, src), nil
}
