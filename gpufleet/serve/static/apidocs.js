// gpufleet serve: the API's reference, drawn from its own /api/openapi.json by this server's script alone
// (no third-party script on the origin whose storage holds the token, and it reads offline).
"use strict";

// ---- API docs --------------------------------------------------------------------------------

function refName(ref) { return ref.split("/").pop(); }
// A schema as one line: a $ref links to its entry below; unions, arrays, enums and maps spelled out.
function schemaType(s) {
  if (!s) return "";
  if (s.$ref) return `<a href="#schema-${esc(refName(s.$ref))}">${esc(refName(s.$ref))}</a>`;
  for (const k of ["anyOf", "oneOf", "allOf"]) if (s[k]) return s[k].map(schemaType).join(k === "allOf" ? " & " : " | ");
  if (s.enum) return s.enum.map((v) => `<code>${esc(JSON.stringify(v))}</code>`).join(" | ");
  if (s.const !== undefined) return `<code>${esc(JSON.stringify(s.const))}</code>`;
  if (s.type === "array") return `${schemaType(s.items) || "any"}[]`;
  if (s.type === "object" && s.additionalProperties && typeof s.additionalProperties === "object") return `{string: ${schemaType(s.additionalProperties) || "any"}}`;
  return esc(s.type || "any");
}
function bodyType(content) {
  const entries = Object.entries(content || {});
  return entries.map(([kind, c]) => `${schemaType(c.schema)} <span class="muted">(${esc(kind)})</span>`).join(", ");
}
function operationBlock(path, method, op) {
  const params = (op.parameters || []).map((p) => `<tr><td><code>${esc(p.name)}</code></td><td>${esc(p.in)}</td>
    <td>${p.required ? "yes" : ""}</td><td>${schemaType(p.schema)}</td><td>${esc(p.description || (p.schema && p.schema.description) || "")}</td></tr>`);
  const responses = Object.entries(op.responses || {}).map(([code, r]) => `<tr><td>${esc(code)}</td><td>${esc(r.description || "")}</td>
    <td>${bodyType(r.content)}</td></tr>`);
  const body = op.requestBody ? `<p>body: ${bodyType(op.requestBody.content)}</p>` : "";
  return `<section class="op" data-method="${esc(method)}" data-path="${esc(path)}">
    <h3><span class="method ${esc(method)}">${esc(method.toUpperCase())}</span> <code>${esc(path)}</code> ${esc(op.summary || "")}</h3>
    ${op.description ? `<p class="muted">${esc(op.description)}</p>` : ""}
    ${params.length ? table(["parameter", "in", "required", "type", "description"], params) : ""}${body}
    ${table(["status", "meaning", "body"], responses)}</section>`;
}
function schemaBlock(name, s) {
  const required = new Set(s.required || []);
  const props = Object.entries(s.properties || {}).map(([k, p]) => `<tr><td><code>${esc(k)}</code></td>
    <td>${required.has(k) ? "yes" : ""}</td><td>${schemaType(p)}</td><td>${esc(p.description || "")}</td></tr>`);
  return `<section class="schema" id="schema-${esc(name)}"><h3>${esc(name)}</h3>
    ${s.description ? `<p class="muted">${esc(s.description)}</p>` : ""}
    ${props.length ? table(["field", "required", "type", "description"], props) : `<p>${schemaType(s)}</p>`}</section>`;
}

async function apiDocsPage() {
  const doc = await api("/api/openapi.json");
  const byTag = {};
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) (byTag[(op.tags || ["other"])[0]] ||= []).push(operationBlock(path, method, op));
  }
  const schemas = Object.entries((doc.components || {}).schemas || {});
  main.innerHTML = `<h1>${esc(doc.info.title)} API ${esc(doc.info.version)}</h1>
    <p>${esc(doc.info.summary || "")} The machine-readable document: <a href="/api/openapi.json">/api/openapi.json</a>.
    Actions (POST) take the token as <code>Authorization: Bearer TOKEN</code>.</p>
    <p class="toc">${Object.keys(byTag).map((t) => `<a href="#tag-${esc(t)}">${esc(t)}</a>`).join(" · ")} · <a href="#schemas">schemas</a></p>
    ${Object.entries(byTag).map(([t, blocks]) => `<h2 id="tag-${esc(t)}">${esc(t)}</h2>${blocks.join("")}`).join("")}
    <h2 id="schemas">Schemas</h2>${schemas.map(([n, s]) => schemaBlock(n, s)).join("")}`;
  document.getElementById("live").textContent = `${Object.values(byTag).flat().length} operations`;
}


PAGES.apidocs = apiDocsPage;
