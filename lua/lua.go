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

// Layout is how the scripts write a record; they read every layout.
type Layout int

const (
	// StringRecords writes each record as one string at the key of earlier releases
	// (layout 2), as the release before this one does, which reads nothing else: the
	// default, so that daemons of both releases can share a Redis.
	StringRecords Layout = iota
	// LeanRecords writes each record as one string at its lean key (layout 3): about
	// half the memory of StringRecords, for a Redis that only daemons of this release
	// or later use.
	LeanRecords
	// HashRecords writes each record as a hash (layout 1), the layout of the releases
	// before the last, which cannot read a string.
	HashRecords
)

// Source returns the script of a transition ("claim", "complete", ...) as Redis runs it,
// writing records in layout and reading them in every layout, unless readOther is false:
// then only at the key that layout writes (the lean key, or the earlier releases' key).
// The script is the shared prelude followed by the transition's own file. A
// "#!lua flags=..." line stays first, where Redis looks for it.
func Source(transition string, layout Layout, readOther bool) (string, error) {
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
	written := map[Layout]int{LeanRecords: 3, StringRecords: 2, HashRecords: 1}[layout]
	return fmt.Sprintf("%slocal WRITE_LAYOUT, READ_OTHER = %d, %t\n%s\n%s", shebang, written, readOther, prelude, src), nil
}
