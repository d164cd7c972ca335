package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// envPrefix starts the name of the environment variable that sets each flag:
// --redis-replica-acks is IDEMD_REDIS_REPLICA_ACKS.
const envPrefix = "IDEMD_"

// envName is the environment variable that sets the flag called name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// fromEnv records which flags took their value from the environment, so that an error
// about a flag can name the variable that set it.
type fromEnv map[string]string

// parseWithEnv parses args, then sets every flag they did not give from its
// environment variable: a flag on the command line beats its variable. A variable set
// to the empty string counts as unset, as orchestrators often write empty values.
// Variables with the prefix that name no flag are ignored, since the clients' IDEMD_URL
// and IDEMD_TOKEN may share the environment.
func parseWithEnv(fs *flag.FlagSet, args []string) (fromEnv, error) {
	usage := fs.Usage
	fs.Usage = func() {
		usage()
		fmt.Fprintf(fs.Output(), "\nEvery flag can also be set by an environment variable: --redis-replica-acks by %s,\nand so on. A flag on the command line beats its variable.\n", envName("redis-replica-acks"))
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	set := fromEnv{}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		value, ok := lookupEnv(envName(f.Name))
		if given[f.Name] || !ok || value == "" || err != nil {
			return
		}
		if serr := fs.Set(f.Name, value); serr != nil {
			err = fmt.Errorf("invalid value %q for --%s from %s: %w", value, f.Name, envName(f.Name), serr)
			return
		}
		set[f.Name] = value
	})
	return set, err
}

// explain adds to an error about a flag that came from the environment the variable
// that set it, so that nobody looks for the flag on a command line without it.
func (e fromEnv) explain(err error) error {
	if err == nil {
		return nil
	}
	var by []string
	for _, name := range slices.Sorted(maps.Keys(e)) {
		if strings.Contains(err.Error(), "--"+name) {
			by = append(by, fmt.Sprintf("--%s was set by %s", name, envName(name)))
		}
	}
	if len(by) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(by, ", "))
}

// lookupEnv reads the environment; a variable so that tests can hand ParseFlags one of
// their own without changing the process's.
var lookupEnv = os.LookupEnv
