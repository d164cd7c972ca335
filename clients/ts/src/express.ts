// The Idempotency-Key middleware for Express 4 and 5: docs/middleware.md, row by row.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { IdemClient } from "./client.js";
import {
  type Answer,
  type BodyRead,
  clientGone,
  Guard,
  type IdempotencyOptions,
  idempotencyLease,
} from "./middleware/guard.js";

export {
  type Incident,
  type IncidentKind,
  type IdempotencyOptions,
  idempotencyLease,
  idempotencySignal,
} from "./middleware/guard.js";

/** The request as Express gives it; originalUrl is the target before any mount point was cut. */
type ExpressRequest = IncomingMessage & { originalUrl?: string };

/**
 * Makes Express handlers idempotent by the Idempotency-Key request header. Mount it after
 * authentication (the scope comes from it) and before any body parser: it reads the body
 * itself to fingerprint it, then hands the same bytes on to the parsers.
 *
 *     app.use(authenticate, idempotency(client, { scope: (req) => req.user.id }), express.json());
 *
 * A handler it runs under a lease finds it at res.locals.idemdLease (docs/effects.md).
 */
export function idempotency<Req extends ExpressRequest = ExpressRequest>(
  client: IdemClient,
  options: IdempotencyOptions<Req>,
): (req: Req, res: ServerResponse, next: (err?: unknown) => void) => void {
  const guard = new Guard<Req>(client, options);
  return (req, res, next) => {
    void handle(guard, req, res, next).catch(next);
  };
}

async function handle<Req extends ExpressRequest>(
  guard: Guard<Req>,
  req: Req,
  res: ServerResponse,
  next: (err?: unknown) => void,
): Promise<void> {
  const read = guard.readKey(req);
  if ("pass" in read) return next();
  if ("answer" in read) return write(res, read.answer);
  const gone = clientGone(res);

  if (req.readableEnded || (req as { _body?: boolean })._body) {
    throw new Error(
      "idempotency middleware: the request body was already read; mount the middleware before body parsers",
    );
  }
  const body = await readBody(req, guard.maxBodyBytes);
  const bodyProblem = guard.bodyAnswer(body);
  if (bodyProblem || !("body" in body)) return write(res, bodyProblem as Answer);

  const decision = await guard.decide(req, req, req.originalUrl ?? req.url ?? "", read.key, body.body, gone);
  if ("gone" in decision) return;
  if ("answer" in decision) {
    write(res, decision.answer);
    guard.report(req, decision.incident);
    return;
  }
  if ("pass" in decision) {
    next();
    guard.report(req, decision.incident);
    return;
  }
  await guard.run(req, req, res, decision.acquired, () => {
    // L1: Express's res.locals is the place for what a middleware hands the handlers.
    const locals = ((res as ServerResponse & { locals?: Record<string, unknown> }).locals ??= {});
    locals.idemdLease = idempotencyLease(req);
    next();
  });
}

function write(res: ServerResponse, answer: Answer): void {
  res.writeHead(answer.status, { ...answer.headers, "content-length": String(answer.body.length) });
  res.end(answer.body);
}

/**
 * Reads the body whole, then puts the same bytes back at the front of the request
 * stream, so that body parsers after the middleware read it as if nothing had.
 */
function readBody(req: IncomingMessage, max: number): Promise<BodyRead> {
  const length = req.headers["content-length"];
  if (length === "0" || (length === undefined && req.headers["transfer-encoding"] === undefined)) {
    return Promise.resolve({ body: Buffer.alloc(0) });
  }
  if (length !== undefined && Number(length) > max) return Promise.resolve({ tooLarge: true });
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const done = (result: BodyRead) => {
      req.off("readable", onReadable);
      req.off("error", onError);
      req.off("close", onClose);
      resolve(result);
    };
    const onReadable = () => {
      for (let chunk = req.read() as Buffer | null; chunk !== null; chunk = req.read() as Buffer | null) {
        chunks.push(chunk);
        size += chunk.length;
        if (size > max) return done({ tooLarge: true });
      }
      // complete is set when the whole message has arrived; 'end' has not been emitted
      // yet, so the bytes can still be put back.
      if (req.complete) {
        const body = Buffer.concat(chunks);
        done({ body });
        if (body.length > 0) req.unshift(body);
      }
    };
    const onError = (err: unknown) => done({ unreadable: err });
    const onClose = () => {
      if (!req.complete) done({ unreadable: new Error("the client went away before sending the whole body") });
    };
    req.on("readable", onReadable);
    req.on("error", onError);
    req.on("close", onClose);
  });
}
