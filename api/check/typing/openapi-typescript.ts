// A strict caller of the types openapi-typescript generates with its default settings,
// through openapi-fetch: the claim takes only a key, narrowing on the outcome (or on the
// status) gives a lease token that is a string, and a problem code the contract does
// not list yet can be compared and handled.
import createClient from "openapi-fetch";
import type { components, paths } from "./gen/openapi-typescript/schema.js";

type Problem = components["schemas"]["Problem"];

export async function claimOrder(baseUrl: string): Promise<string | undefined> {
  const client = createClient<paths>({ baseUrl });
  const { data, error } = await client.POST("/v1/claim", { body: { key: "order-1" } });
  if (error) {
    return handleProblem(error);
  }
  // @ts-expect-error: a finished key has no lease token, so it must be narrowed first.
  const unchecked: string = data.lease_token;
  void unchecked;
  if (data.outcome === "acquired") {
    const token: string = data.lease_token;
    return token;
  }
  const finished: "completed" | "failed" = data.outcome;
  return finished;
}

// The answers of 201 and 200 share one type, told apart by the outcome, so that a
// generator that keeps one success type per operation (OpenAPI Generator's Java) reads
// both; narrowed, the 201's token is always there.
export function tokenOfCreated(
  created: paths["/v1/claim"]["post"]["responses"][201]["content"]["application/json"],
): string | undefined {
  return created.outcome === "acquired" ? created.lease_token : undefined;
}

function handleProblem(problem: Problem): string {
  switch (problem.code) {
    case "in_progress":
      return `retry in ${problem.retry_after_ms ?? 1000} ms`;
    case "a_code_added_later":
      return "known to this caller only";
    default: {
      const code: string = problem.code;
      return `${problem.status} ${code}`;
    }
  }
}

// A batch takes items of one operation each, and each result carries its status and
// the single call's answer or problem, typed.
export async function claimBoth(baseUrl: string): Promise<string[]> {
  const client = createClient<paths>({ baseUrl });
  const { data } = await client.POST("/v1/batch", {
    body: { items: [{ claim: { key: "order-1" } }, { complete: { key: "order-2", lease_token: "t", response: { status: 201 } } }] },
  });
  if (data === undefined) {
    return [];
  }
  return data.results.map((result) => {
    if (result.acquired !== undefined) {
      const token: string = result.acquired.lease_token;
      return token;
    }
    if (result.problem !== undefined) {
      return handleProblem(result.problem);
    }
    return String(result.status);
  });
}
