// The low-level client, generated from the contract into src/gen (committed; never
// edited by hand: `npm run check-generated` regenerates it and fails on any diff).
// Imports end in .js, as Node's ESM resolution (tsconfig: nodenext) needs.
export default {
  input: "../../api/openapi.yaml",
  output: { path: "src/gen", importFileExtension: ".js" },
};
