package appbench

import (
	"slices"
	"testing"
)

// TestAppFlagsPerConfiguration: a profile asked of every app goes to a file of each
// configuration's own, not to one file that the last app to stop overwrites.
func TestAppFlagsPerConfiguration(t *testing.T) {
	flags := []string{"-cpuprofile", "/tmp/app-{config}.prof", "-sdk-batching=false"}
	b, c := appFlags(flags, "b"), appFlags(flags, "c")
	if want := []string{"-cpuprofile", "/tmp/app-b.prof", "-sdk-batching=false"}; !slices.Equal(b, want) {
		t.Errorf("flags of (b): %q, want %q", b, want)
	}
	if b[1] == c[1] {
		t.Errorf("(b) and (c) both profile to %s", b[1])
	}
	if flags[1] != "/tmp/app-{config}.prof" {
		t.Errorf("the flags given were changed: %q", flags)
	}
}
