package io.idemd;

/** What run returns: the work's value, and whether it was replayed from an earlier run. */
public record RunResult<T>(T value, boolean replayed) {}
