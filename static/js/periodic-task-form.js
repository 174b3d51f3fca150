// Admin site, periodic task form (django-celery-beat): under the crontab field, say the chosen
// schedule in words. django-celery-beat does this in an inline script, which the content
// security policy refuses; this is the same behaviour from a static file.
(function () {
  var data = document.getElementById("readable-crontabs");
  var select = document.getElementById("id_crontab");
  var help = document.querySelector(".field-crontab .help");
  if (!data || !select || !help) { return; }
  var readable = JSON.parse(data.textContent);
  var translation = document.createElement("div");
  help.appendChild(translation);
  var row = document.querySelector(".field-crontab_translation");
  if (row) { row.style.display = "none"; }
  function update() {
    var words = readable[select.value];
    translation.textContent = words ? "Translation: " + words : "";
  }
  select.addEventListener("change", update);
  update();
})();
