package floorbench_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/loadtest/floorbench"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// floorDir is the floor's source: IDEMD_FLOOR_DIR, or shared/bench/floor beside the
// repository. Without it the test says so and skips, unless IDEMD_REQUIRE_FLOOR is set.
func floorDir(t *testing.T) string {
	dir := os.Getenv("IDEMD_FLOOR_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "..", "shared", "bench", "floor")
	}
	if _, err := os.Stat(filepath.Join(dir, "main.go")); err != nil {
		if os.Getenv("IDEMD_REQUIRE_FLOOR") != "" {
			t.Fatalf("the floor is required (IDEMD_REQUIRE_FLOOR is set) but not at %s: %v", dir, err)
		}
		t.Skipf("the floor is not at %s (set IDEMD_FLOOR_DIR): %v", dir, err)
	}
	return dir
}

// TestFloorbenchSmoke runs the command's whole path once on a few cycles: it builds
// the floor, idemd and idemd-load, starts them with their redis-servers, and prints a
// row for every target, each with CPU counted for its server and the generator.
func TestFloorbenchSmoke(t *testing.T) {
	redisBin := testredis.Binary(t)
	dir := floorDir(t)
	var out bytes.Buffer
	err := floorbench.Run(context.Background(), floorbench.Config{
		FloorDir: dir, ModuleDir: filepath.Join("..", "..", ".."), RedisServer: redisBin,
		Targets: []string{"floor", "redis", "embedded"}, Clients: []int{2}, Rounds: 1, Cycles: 40, Out: &out,
	})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| floor | ", "| idemd, Redis | ", "| idemd, embedded store | ", "against floor in the same round"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the output", want)
		}
	}
	runs := 0
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "round ") {
			runs++
			if !strings.Contains(line, " 40 cycles") || !strings.Contains(line, "(0 errors)") {
				t.Errorf("a run did not finish its 40 cycles without errors: %s", line)
			}
		}
	}
	if runs != 3 {
		t.Errorf("%d runs, want one for each of the 3 targets", runs)
	}
}

// TestFloorbenchClusterSmoke forms clusters of one and two masters, each with its
// daemons, and measures one run on each.
func TestFloorbenchClusterSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no Redis Cluster")
	}
	redisBin := testredis.Binary(t)
	var out bytes.Buffer
	err := floorbench.Run(context.Background(), floorbench.Config{
		ModuleDir: filepath.Join("..", "..", ".."), RedisServer: redisBin,
		Clients: []int{4}, Rounds: 1, Cycles: 60, Masters: []int{1, 2}, Out: &out,
	})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"round 1, 1 masters, 4 clients: 60 cycles", "round 1, 2 masters, 4 clients: 60 cycles", "| 1 | ", "| 2 | ", "(0 errors)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the output", want)
		}
	}
}

// TestAtSizeSmoke fills each store to two small sizes and measures each once: every
// store's summary is printed at each size, with export timed and, for the embedded
// store, backup, and the feed listing the abandoned keys the fill left.
func TestAtSizeSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no Redis Cluster")
	}
	redisBin := testredis.Binary(t)
	var out bytes.Buffer
	err := floorbench.RunAtSize(context.Background(), floorbench.SizeConfig{
		ModuleDir: filepath.Join("..", "..", ".."), RedisServer: redisBin,
		Stores: []string{"embedded", "redis", "cluster"}, Records: []int{100, 300},
		Shapes: []string{floorbench.Shape1KiB, floorbench.ShapeLease}, ShapeRecords: []int{50},
		Rounds: 1, ToolRounds: 1, Clients: []int{2}, Cycles: 20, Dir: t.TempDir(), Out: &out,
	})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, store := range []string{"embedded", "redis", "cluster"} {
		for _, n := range []string{"100", "300"} {
			if want := "summary " + store + " at " + n + " records"; !strings.Contains(out.String(), want) {
				t.Errorf("no %q in the output", want)
			}
		}
		for _, shape := range []string{"1kib", "lease"} {
			if want := "shape " + shape + ", " + store + ", 50 records: "; !strings.Contains(out.String(), want) {
				t.Errorf("no %q in the output", want)
			}
		}
	}
	for _, want := range []string{"(10 keys)", "; backup ", "; export "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the output", want)
		}
	}
	if strings.Contains(out.String(), " errors: ") {
		t.Errorf("a load run had errors")
	}
}
