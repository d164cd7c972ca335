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

// Source returns the script of a transition ("claim", "complete", ...) as Redis runs it:
// the shared prelude followed by the transition's own file. A "#!lua flags=..." line
// stays first, where Redis looks for it.
func Source(transition string) (string, error) {
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
	return shebang + string(prelude) + "\n" + src, nil
}
