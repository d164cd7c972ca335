// Package version names the release this tree is: the number `idemd --version`,
// `idemctl version` and idemd_build_info report, the number the SDKs' packages carry, and
// the one CHANGELOG.md's newest entry is headed with.
//
// A release changes Release in one commit with its CHANGELOG.md entry and tags that
// commit v<Release>; the commits after it keep the number until the next release.
package version

// Release is the semantic version of the daemon, idemctl and the four SDKs. The contract
// (api/openapi.yaml) keeps a version of its own, Contract, since clients generated from it
// care only about what it describes.
const Release = "0.6.0"

// Contract is the version of api/openapi.yaml this release serves (its info.version).
const Contract = "1.6.0"
