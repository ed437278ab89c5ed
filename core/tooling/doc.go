// Package tooling marks the folder that holds everything kvc-router uses to
// test and measure itself but never ships: the engine simulator (sim), the
// trace-replay benchmark (bench) and re-implemented peer routers (peers).
// The shipped library (./cabi) must not import anything below this folder;
// a test in cabi checks that with the package graph.
package tooling
